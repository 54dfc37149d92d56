"""The learning-curve study (issue 29, conf/study/curves.yaml, docs/results/curves.md) as a kind of ``tracerl study``
grid (``CURVES``): the CLI runs it in place of the plain study for a config whose testbeds set ``stop_tokens``
(commands.py). Its cells stop on tokens and evaluate on a token schedule (curve_cells), each finished cell's curve
file is kept on its run, and its report is curves.md (curves_doc)."""

from __future__ import annotations

from tracerl.workflows.experiments.curve_cells import check_curve_study, curve_overrides, keep_curve
from tracerl.workflows.experiments.curves_doc import write_curves_report
from tracerl.workflows.study.grid import StudyKind

CURVES = StudyKind(
    report_name="curves.md",
    write_report=write_curves_report,
    check=check_curve_study,
    cell_overrides=curve_overrides,
    after_cell=keep_curve,
    kept="curve file",
)
