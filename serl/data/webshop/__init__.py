"""WebShop's 1k-product split, shipped with serl (data only; see SOURCE.md and LICENSE here).

Read through :mod:`serl.envs.webshop.data`, which decompresses the ``.xz`` files and checks
their sha256. This file only makes the folder a package so that its data files are installed.
"""
