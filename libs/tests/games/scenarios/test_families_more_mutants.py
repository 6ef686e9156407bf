"""Tests written against surviving mutants of the scenario families not covered by test_family_rules_mutants.py
(coalition, prisoners_dilemma, public_goods, trust, ultimatum).

Every expectation is the family rule written out by hand (the module docstrings) or a hand-computed table.
"""
