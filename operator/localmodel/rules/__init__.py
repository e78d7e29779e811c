"""Tuning rules: data with sources, and a small ordered evaluator.

Import the module you need: the shapes (`rules.model`) and the steps engines'
own rules share (`rules.steps`) sit below the engine adapters; the table
(`rules.table`), the evaluator (`rules.evaluate`) and the docs (`rules.docs`)
above the registry. This package imports none of them, so importing the shapes
does not import the table.
"""
