"""Reading results: report.json's summary, layers, gates, run identity and comparing two runs."""

__all__: list[str] = []
