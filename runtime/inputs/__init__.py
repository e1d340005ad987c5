"""Inputs: deterministic generated streams and the checks run on input files
before anything starts.
"""
