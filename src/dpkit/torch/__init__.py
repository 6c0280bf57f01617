"""DP-SGD for PyTorch (optional extra: ``pip install 'dpkit[torch]'``)."""
