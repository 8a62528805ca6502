"""Reports from run folders: the logs (:mod:`.data`), the figures (:mod:`.plots`), the HTML page (:mod:`.html`), a
run's summary and report (:mod:`.page`), the comparison of several runs (:mod:`.comparison_table`)."""

from grouprl.report.page import summarize, write_report

__all__ = ["summarize", "write_report"]
