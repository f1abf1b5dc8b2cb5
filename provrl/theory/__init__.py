"""Exact TRPO quantities on tabular MDPs and mixed-version importance sampling."""
