"""Reports from run folders: reading the logs (:mod:`.data`), the figures (:mod:`.plots`), the HTML
page (:mod:`.html`), a run's summary and report (:mod:`.page`), and the comparison of several runs
(:mod:`.compare`)."""

from grouprl.report.page import summarize, write_report

__all__ = ["summarize", "write_report"]
