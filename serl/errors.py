"""serl's exception types, in one leaf module.

Every error a user can meet at the command line derives from :class:`SerlError`, so that
``serl`` prints it as one line (``serl: <message>``) instead of a traceback. This module imports
nothing from serl, so any module may import it without creating an import circle.

Where each is raised:

- :class:`ConfigError` — a config key is unknown, has the wrong type or an out-of-range value
  (raised while the config is parsed and validated, before any model loads).
- :class:`EnvError` — an environment could not load or run a task (missing data, a corrupt game
  file); :class:`EnvWorkerError`, a subclass, when an env worker process died, hung or raised.
- :class:`ModelLoadError` — the model or tokenizer could not be found or loaded.
- :class:`CheckpointError` — a checkpoint is missing or unreadable.
- :class:`JudgeError` — the LLM judge could not be reached or answered badly, and
  ``algorithm.serl.judge_request_strict`` is on.
- :class:`DataDownloadError` — a data set could not be downloaded or unpacked.
- :class:`SandboxError` — the code sandbox cannot be used as configured (isolation required but
  unavailable, a bad option, used after close); never for what the executed code does.
"""

from __future__ import annotations


class SerlError(Exception):
    """Base class of the errors serl raises on bad input, data, config or environment state."""


class ConfigError(SerlError, ValueError):
    """A config key is unknown, has the wrong type, or an out-of-range value."""


class EnvError(SerlError, RuntimeError):
    """An environment could not load or run a task (missing data, corrupt game file, dead worker)."""


class EnvWorkerError(EnvError):
    """An env worker failed: it died, hung, or an env call raised inside it.

    Attributes:
        env_index: index of the env being served when the failure happened (``None`` if the
            worker failed before serving any env, e.g. at start-up).
        task_id: that env's current task id (the ALFWorld ``game.tw-pddl`` path), if known.
        worker: index of the worker process (``None`` in serial mode).
        exitcode: the worker's exit code when it died (negative: killed by that signal).
        remote_traceback: the formatted traceback from inside the worker, for env exceptions.
    """

    def __init__(
        self,
        message: str,
        *,
        env_index: int | None = None,
        task_id: str | None = None,
        worker: int | None = None,
        exitcode: int | None = None,
        remote_traceback: str | None = None,
    ):
        super().__init__(message)
        self.env_index = env_index
        self.task_id = task_id
        self.worker = worker
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


class ModelLoadError(SerlError, RuntimeError):
    """The model or tokenizer could not be found or loaded."""


class CheckpointError(SerlError, RuntimeError):
    """A checkpoint is missing or unreadable."""


class JudgeError(SerlError, RuntimeError):
    """The judge could not be reached or answered badly, and ``judge_request_strict`` is on."""


class DataDownloadError(SerlError, RuntimeError):
    """A data set could not be downloaded or unpacked; the message says what failed and what to
    do instead."""


class SandboxError(SerlError, RuntimeError):
    """The sandbox cannot be used as configured: isolation was required but is not available on
    this machine, an option is invalid, or the sandbox was used after ``close``. Never raised
    for what the executed code does (that is a :class:`serl.sandbox.ExecutionResult`)."""
