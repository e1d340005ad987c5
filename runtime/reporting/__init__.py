"""Run outputs for both engines: metric definitions, report.json, report.png and
the live metrics' names.
"""
