"""The orchestration, grouped by what it does: recipe/ (the recipe), run/ (running a plan), publish/ (the store,
the published folder, packages), results/ (report.json, gates, comparing runs); report/ renders, sweep/ runs many.
"""

__all__: list[str] = []
