"""Predicates: the typed AST of a harness filter and its translations."""

from planners.predicates.arrow import to_arrow
from planners.predicates.ast import Expr, columns, conjoin, conjuncts, nan_safe, rename
from planners.predicates.parse import MAX_FILTER_DEPTH, coerce, parse_filter
from planners.predicates.prune import can_match
from planners.predicates.sql import quote_ident, to_sql

__all__ = [
    "MAX_FILTER_DEPTH",
    "Expr",
    "can_match",
    "coerce",
    "columns",
    "conjoin",
    "conjuncts",
    "nan_safe",
    "parse_filter",
    "quote_ident",
    "rename",
    "to_arrow",
    "to_sql",
]
