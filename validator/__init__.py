"""Gauntlet: evaluation, ratings, selection, aggregation and the validator's round logic.

`validator` imports `protocol`, never `node`.
"""
