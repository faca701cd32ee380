"""The JSON schema (draft 2020-12) of an experiment config, generated from the pydantic models.

Snakemake validates a config against workflow/schemas/config.schema.yaml before planning any
job; that file is this module's output, so every key, type and bound is written once, in
`incofl.config`. `python -m incofl.schema` prints the schema, `python -m incofl.schema --write`
rewrites the file (tests/test_schema.py fails while it is stale).

What `ExperimentConfig.model_json_schema()` gives is post-processed:
- no `default` anywhere: Snakemake's `validate()` would fill the schema's defaults into the
  config; pydantic is the one place for defaults;
- no `title`s (pydantic's "Clients", "Eval Every", ...: noise in the file); descriptions
  (docstrings of nested models) on one line;
- enums for the names pydantic checks with functions, not types: data sets
  (`incofl.config.DATASETS`), models (`MODELS`) and methods (the keys of
  `incofl.fl.methods.METHODS`, also the keys of `per_method`), read from those registries;
- variants: a name (`incofl.config.NAME`, not a method's) for each, whose `method` is a
  registered method; `methods` lists registered methods, or also variant names where the
  config has variants (whether those are defined is pydantic's check);
- a `$schema` line and a header description.
Types, enums of `Literal` fields, bounds (`ge`, `gt`, `le`, `lt`, `min_length`) and
`additionalProperties: false` (extra="forbid") come from pydantic unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from incofl.config import DATASETS, MODELS, NAME, ExperimentConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
REGENERATE = "python -m incofl.schema --write"
HEADER = (
    f"# Generated from the pydantic models in src/incofl/config.py by `{REGENERATE}`:\n"
    "# do not edit by hand (tests/test_schema.py fails when this file is stale).\n"
)
DESCRIPTION = (
    "An experiment config (config/*.yaml): the grid (datasets x alphas x methods x seeds), the "
    "settings every run shares, per-method overrides, method variants and workflow job resources. Generated from "
    "the pydantic model incofl.config.ExperimentConfig, the reference for meaning and cross-field "
    "checks, so that Snakemake rejects a bad config before planning any job. No defaults here: "
    "pydantic is the one place for them (the validate() of Snakemake would fill schema defaults into "
    "the config)."
)


def _names() -> dict[str, tuple[str, tuple[str, ...], list[str]]]:
    """$defs name -> (description, the registry's names, the list fields whose items they are)."""
    from incofl.fl.methods import METHODS  # late import: the registry imports the engine

    return {
        "Dataset": ("a data set (incofl.config.DATASETS)", DATASETS, ["datasets"]),
        "Model": ("a model (incofl.config.MODELS)", MODELS, ["models"]),
        "Method": ("a method (incofl.fl.methods.METHODS, `incofl methods`)", tuple(METHODS), ["methods"]),
    }


def _clean(node: Any) -> Any:
    """`node` without `default` and `title` keywords at any depth (names of properties and
    $defs are kept, even these two), descriptions (docstrings) on one line."""
    if isinstance(node, list):
        return [_clean(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("default", "title"):
            continue
        if key in ("properties", "$defs", "patternProperties"):  # maps of name -> schema
            out[key] = {name: _clean(sub) for name, sub in value.items()}
        elif key == "description" and isinstance(value, str):
            out[key] = " ".join(value.split())
        else:
            out[key] = _clean(value)
    return out


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def config_schema() -> dict[str, Any]:
    """The experiment config's JSON schema, as workflow/schemas/config.schema.yaml holds it."""
    body = _clean(ExperimentConfig.model_json_schema(mode="validation"))
    if body.get("additionalProperties") is not False:
        raise RuntimeError("ExperimentConfig must forbid unknown keys (extra='forbid')")
    props = body["properties"]
    defs = body.get("$defs", {})
    for def_name, (what, names, fields) in _names().items():
        defs[def_name] = {"description": what, "enum": list(names)}
        for field in fields:
            if props[field].get("items") != {"type": "string"}:
                raise RuntimeError(f"{field}: expected a list of strings, got {props[field]}")
            props[field]["items"] = {"$ref": f"#/$defs/{def_name}"}
    per_method = props["per_method"]
    if per_method.get("type") != "object":
        raise RuntimeError(f"per_method: expected a mapping, got {per_method}")
    per_method["propertyNames"] = {"$ref": "#/$defs/Method"}
    defs["Variant"] = {
        "description": "a variant's name: letters, digits and '-', not a registered method's",
        "type": "string",
        "pattern": f"^{NAME}$",
        "not": _ref("Method"),
    }
    variants = props["variants"]
    if variants.get("additionalProperties") != {"additionalProperties": True, "type": "object"}:
        raise RuntimeError(f"variants: expected a mapping of mappings, got {variants}")
    variants["propertyNames"] = _ref("Variant")
    variants["additionalProperties"] |= {"required": ["method"], "properties": {"method": _ref("Method")}}
    props["methods"]["items"] = {"anyOf": [_ref("Method"), _ref("Variant")]}
    return {
        "$schema": DIALECT,
        "description": DESCRIPTION,
        "type": body.pop("type"),
        "additionalProperties": body.pop("additionalProperties"),
        "properties": props,
        # without variants, `methods` are registered methods only
        "if": {"required": ["variants"], "properties": {"variants": {"minProperties": 1}}},
        "else": {"properties": {"methods": {"items": _ref("Method")}}},
        "$defs": dict(sorted(defs.items())),
    }


def render(schema: dict[str, Any] | None = None) -> str:
    """The schema as YAML, with the header comment: the content of the schema file."""
    text = yaml.safe_dump(
        config_schema() if schema is None else schema, sort_keys=False, default_flow_style=None, width=100
    )
    return HEADER + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m incofl.schema", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {SCHEMA_FILE} instead of printing")
    args = parser.parse_args(argv)
    text = render()
    if not args.write:
        sys.stdout.write(text)
        return 0
    if not SCHEMA_FILE.parent.is_dir():
        parser.error(f"{SCHEMA_FILE.parent}: not found (--write needs a source checkout, pip install -e .)")
    SCHEMA_FILE.write_text(text)
    print(f"wrote {SCHEMA_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
