"""Compiled kernels shared by the groupings and the apps: the numba decorator and
the frequency sketches.
"""
