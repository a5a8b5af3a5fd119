"""Preprocessing: raw text to ``.bin``/``.idx`` (``binarize``, ``documents``), the engines that run it
(``engines``: local processes or Ray), its options, and the text readers (``rawtext``, ``textio``). Imports
storage, sources and the base modules.
"""
