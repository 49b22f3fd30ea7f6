"""Math datasets shipped with serl (data only; see SOURCE.md, README_AIME.md and the LICENSE files here).

GSM8K train/test, MATH-500, a 15-row DAPO-Math-17k fixture, and the answer keys (ids and answers only) of
AIME 2024/2025. Read through :mod:`serl.envs.math.data`, which decompresses the ``.gz`` files and checks
their sha256. This file only makes the folder a package so that its data files are installed.
"""
