"""Operators: what the workers run on records, and how the aggregator combines it.

Pure (numpy/pyarrow/numba; no Ray, no Spark at import). The contract
(``contract``), loading a user's class (``loading``), the built-ins
(``counting``: WordCount, NaiveBayes; ``heavy_hitters``; ``aggregate``), the
``app:`` section -> operator entry point (``registry``), and Spark's own answer
for checks (``reference``; PySpark imported only when called).

The runtime holds a ``BoundOperator`` (``operator_for_app(app, base_dir)``)
and only calls ``create/add/compact/merge/finish`` and reads ``.spec``
(``OperatorSpec``: columns, mergeable, wants_key_hash); every failure inside
an operator is a one-line ``OperatorError``.
"""

from runtime.operators.aggregate import AGGS, Aggregate, check_aggs, check_value_type
from runtime.operators.contract import (
    BoundOperator,
    OperatorError,
    OperatorSpec,
    bind,
    check_operator_class,
    find_operator_error,
    instantiate,
    require_mergeable,
    spec_of,
)
from runtime.operators.counting import NaiveBayes, WordCount
from runtime.operators.heavy_hitters import HeavyHitters
from runtime.operators.loading import (
    file_fingerprint,
    load_operator,
    make_operator,
    module_name_for,
    runtime_env_for,
)
from runtime.operators.reference import spark_reference, table_diff, tables_equal
from runtime.operators.registry import BUILTINS, KINDS, builtin_operator, operator_for_app
from runtime.operators.runner import AggregatorApp, WorkerApp
from runtime.operators.tables import (
    HEAVY_HITTERS_SCHEMA,
    NAIVE_BAYES_SCHEMA,
    WORDCOUNT_SCHEMA,
    as_string_array,
    sort_result,
)

__all__ = [
    "AGGS",
    "BUILTINS",
    "HEAVY_HITTERS_SCHEMA",
    "KINDS",
    "NAIVE_BAYES_SCHEMA",
    "WORDCOUNT_SCHEMA",
    "Aggregate",
    "AggregatorApp",
    "BoundOperator",
    "HeavyHitters",
    "NaiveBayes",
    "OperatorError",
    "OperatorSpec",
    "WordCount",
    "WorkerApp",
    "as_string_array",
    "bind",
    "builtin_operator",
    "check_aggs",
    "check_operator_class",
    "check_value_type",
    "file_fingerprint",
    "find_operator_error",
    "instantiate",
    "load_operator",
    "make_operator",
    "module_name_for",
    "operator_for_app",
    "require_mergeable",
    "runtime_env_for",
    "sort_result",
    "spark_reference",
    "spec_of",
    "table_diff",
    "tables_equal",
]
