"""The examples, shipped as ``babelfeed.examples`` so ``babelfeed demo`` trains outside the checkout too:
``python -m babelfeed.examples.torch_train --steps=100``."""
