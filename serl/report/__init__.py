"""``serl report``: one self-contained HTML page of one or more runs (curves, evaluations and a
trajectory browser with SERL's per-token weights). :mod:`serl.report.data` reads a run folder,
:mod:`serl.report.html` renders the page from the package's ``assets/``. Reads run files only;
never imports the trainer."""
