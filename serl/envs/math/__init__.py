"""Math with a code interpreter (SPEAR's third setting): problem sets and answer scorers.

* :mod:`serl.envs.math.data`: the dataset registry (GSM8K, MATH-500, AIME 2024/2025, DAPO-Math-17k),
  :func:`load_problems`, :class:`MathProblem` and SPEAR's prompt (:func:`user_prompt`).
* :mod:`serl.envs.math.scoring`: ``strict`` (SPEAR's exact ``\\boxed{}`` match), ``normalized`` and
  ``math_verify`` scorers; :func:`get_scorer`.
* :mod:`serl.envs.math.download`: fetch the full DAPO-Math-17k into a data folder.

Importing this package imports neither math-verify nor pyarrow; they load on first use.
"""

from serl.envs.math.data import ANSWER_FORMAT, DATASETS, MathProblem, answer_key, load_problems, user_prompt
from serl.envs.math.scoring import SCORERS, ScoreResult, default_scorer, get_scorer, last_boxed

__all__ = ["ANSWER_FORMAT", "DATASETS", "MathProblem", "SCORERS", "ScoreResult", "answer_key", "default_scorer",
           "get_scorer", "last_boxed", "load_problems", "user_prompt"]
