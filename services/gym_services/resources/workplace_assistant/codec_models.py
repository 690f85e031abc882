"""Wire shapes of the Workplace checkpoint state (validated strictly on decode).

A session state is ``{"schema_version": 2, "base": <sha256>, "tables": {container: {attr: T}}}``
where ``T`` is ``{}`` (identical to the base table), ``{"full": PlainTable}``, or a diff
(``index``, ``removed``, ``appended``, ``cells``, ``retyped``; absent keys mean "nothing").
Rows are addressed by position, never by index label (labels may repeat, or be renumbered by an
append): ``removed`` lists base row positions, ``cells.rows`` positions in the session's table, and
``index`` gives the session's index itself when it is not the base's.

A column is ``{"dtype", "values", "nan"}``: JSON writes NaN and ``None`` both as ``null``, so
``nan`` lists the positions of the ``null`` values that are NaN, ``json_cells`` the cells holding a JSON list
or object (their ``values`` entry is ``null``); every other ``null`` is ``None``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
)

Scalar: TypeAlias = StrictStr | StrictBool | StrictInt | StrictFloat | None
DtypeName = Literal["object", "bool", "int64", "float64", "str"]
Digest = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    # mutable defaults are default_factory: a plain ``[]`` default is deep-copied per instance, which was a
    # fifth of validating a restored session
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ValuesModel(_Strict):
    values: list[Scalar]
    nan: list[StrictInt] = Field(default_factory=list)
    #: ``[position, value]`` of cells holding a JSON list or object (``object`` columns only; the
    #: tools store arguments as given, so a model's ``{"a": 1}`` can become a cell)
    json_cells: list[Annotated[list[Any], Field(min_length=2, max_length=2)]] = Field(default_factory=list)


class ColumnModel(ValuesModel):
    dtype: DtypeName


class RangeIndexModel(_Strict):
    kind: Literal["range"]
    start: StrictInt
    stop: StrictInt
    step: StrictInt
    name: Scalar = None


class LabelIndexModel(ColumnModel):
    kind: Literal["labels"]
    name: Scalar = None


IndexModel = Annotated[RangeIndexModel | LabelIndexModel, Field(discriminator="kind")]


class PlainTableModel(_Strict):
    index: IndexModel
    columns: IndexModel
    data: list[ColumnModel]


class RangeShapeModel(_Strict):
    kind: Literal["range"]
    start: StrictInt
    stop: StrictInt
    step: StrictInt


class RunsShapeModel(_Strict):
    """An int64 index as runs of consecutive labels: ``[[first label, length], ...]``."""

    kind: Literal["runs"]
    runs: list[Annotated[list[StrictInt], Field(min_length=2, max_length=2)]]


IndexShapeModel = Annotated[RangeShapeModel | RunsShapeModel, Field(discriminator="kind")]


class CellsModel(ValuesModel):
    rows: list[StrictInt]  # row positions in the session's table (among the kept rows)


class AppendedModel(_Strict):
    count: StrictInt
    data: dict[str, ValuesModel]


class DiffTableModel(_Strict):
    index: IndexShapeModel | None = None
    removed: list[StrictInt] = Field(default_factory=list)
    appended: AppendedModel | None = None
    cells: dict[str, CellsModel] = Field(default_factory=dict)
    retyped: dict[str, ColumnModel] = Field(default_factory=dict)


class FullTableModel(_Strict):
    full: PlainTableModel


def _table_kind(value: Any) -> str:
    return "full" if isinstance(value, dict) and "full" in value else "diff"


TableModel = Annotated[
    Annotated[FullTableModel, Tag("full")] | Annotated[DiffTableModel, Tag("diff")],
    Discriminator(_table_kind),
]


class SessionStateModel(_Strict):
    schema_version: StrictInt
    base: Digest
    tables: dict[str, dict[str, TableModel]]


class PlainStateModel(_Strict):
    schema_version: StrictInt
    tables: dict[str, dict[str, PlainTableModel]]
