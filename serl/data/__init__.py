"""Data shipped with serl and the helpers that fetch the full datasets.

* ``serl/data/alfworld/``: a small ALFWorld fixture (2 games per task type in ``train`` and
  ``valid_unseen``; see its ``SOURCE.md`` and ``LICENSE``), the default data folder of the
  ``alfworld`` env (:func:`serl.envs.alfworld.resolve_data_dir`).
* :mod:`serl.data.download`: ``serl data download alfworld`` (ALFWorld's official release
  assets) and extraction of local archives.

Nothing is imported here, so ``import serl.data`` stays light.
"""
