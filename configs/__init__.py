"""The configs that come with babelfeed, installed as ``babelfeed.configs``: each file defines ``get_config()``.

Name one anywhere, checkout or not: ``babelfeed.load_config("nllb_like")``, ``babelfeed plan nllb_like``,
``babelfeed demo --config demo``. A path to a file of your own works the same way.
"""
