"""Localization: the methods (`methods`), their designs and settings, and a run as explicit stages
(`localization.Localization`: preflight, measure, solve, confirm, validate, report). Estimating effects is
`specificity`'s, the selection rule `selection`'s, deciding it by measurement `confirm`'s, measuring fixed ablations
`validate`'s."""
