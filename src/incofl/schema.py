"""The JSON schema (draft 2020-12) of an experiment config, generated from the pydantic models.

Snakemake validates a config against workflow/schemas/config.schema.yaml before planning any
job; that file is this module's output, so every key, type and bound is written once, in
`incofl.config`. `python -m incofl.schema` prints the schema, `--markdown` the reference of every key that
config/README.md holds (type and range from the schema, default and description from the models),
and `python -m incofl.schema --write` rewrites both files (tests/test_schema.py fails while either
is stale).

What `ExperimentConfig.model_json_schema()` gives is post-processed:
- no `default` anywhere: Snakemake's `validate()` would fill the schema's defaults into the
  config; pydantic is the one place for defaults;
- no `title`s (pydantic's "Clients", "Eval Every", ...: noise in the file); descriptions
  (docstrings of nested models) on one line;
- enums for the names pydantic checks with functions, not types: data sets
  (`incofl.config.DATASETS`) and models (`incofl.models.names.MODELS`), read from those lists;
- method names (`methods`, the keys of `per_method`, a variant's `method`) and variant names
  as names only (`incofl.config.NAME`): the registry collects a method from its family's folder
  (incofl.registry), so whether a name is registered is the config validation's check, which
  the workflow runs right after this schema; a list here would go stale with every new method;
- a `$schema` line and a header description.
Types, enums of `Literal` fields, bounds (`ge`, `gt`, `le`, `lt`, `min_length`) and
`additionalProperties: false` (extra="forbid") come from pydantic unchanged.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from incofl.config import DATASETS, NAME, ExperimentConfig, RunConfig, Settings
from incofl.models.names import MODELS

DIALECT = "https://json-schema.org/draft/2020-12/schema"
ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "workflow" / "schemas" / "config.schema.yaml"
MARKDOWN_FILE = ROOT / "config" / "README.md"
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
    return {
        "Dataset": ("a data set (incofl.config.DATASETS)", DATASETS, ["datasets"]),
        "Model": ("a model (incofl.models.names.MODELS)", MODELS, ["models"]),
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
    defs["Method"] = {
        "description": "a registered method (`incofl methods`), or in `methods` a variant's name; whether it is "
        "registered is checked by incofl's config validation, after this schema",
        "type": "string",
        "pattern": f"^{NAME}$",
    }
    per_method = props["per_method"]
    if per_method.get("type") != "object":
        raise RuntimeError(f"per_method: expected a mapping, got {per_method}")
    per_method["propertyNames"] = _ref("Method")
    defs["Variant"] = {
        "description": "a variant's name: letters, digits and '-', not a registered method's",
        "type": "string",
        "pattern": f"^{NAME}$",
    }
    variants = props["variants"]
    if variants.get("additionalProperties") != {"additionalProperties": True, "type": "object"}:
        raise RuntimeError(f"variants: expected a mapping of mappings, got {variants}")
    variants["propertyNames"] = _ref("Variant")
    variants["additionalProperties"] |= {"required": ["method"], "properties": {"method": _ref("Method")}}
    if props["methods"].get("items") != {"type": "string"}:
        raise RuntimeError(f"methods: expected a list of strings, got {props['methods']}")
    props["methods"]["items"] = _ref("Method")
    return {
        "$schema": DIALECT,
        "description": DESCRIPTION,
        "type": body.pop("type"),
        "additionalProperties": body.pop("additionalProperties"),
        "properties": props,
        "$defs": dict(sorted(defs.items())),
    }


def render(schema: dict[str, Any] | None = None) -> str:
    """The schema as YAML, with the header comment: the content of the schema file."""
    text = yaml.safe_dump(
        config_schema() if schema is None else schema, sort_keys=False, default_flow_style=None, width=100
    )
    return HEADER + text


# config/README.md: the top-level keys by model (SECTIONS), then a section per nested mapping.
NESTED = {"analyses": "Analyses", "resources": "Resources", "robustness": "Robustness", "case_study": "CaseStudy"}
MARKDOWN_HEAD = f"""# Config keys

<!-- Generated from the pydantic models in src/incofl/config.py by `{REGENERATE}`:
do not edit by hand (tests/test_schema.py fails when this file is stale). -->

Every key of an experiment config (`config/*.yaml`), its default and the values it accepts. A
config is checked before anything runs: an unknown key or a value out of range is one line naming
the key, and exit code 2. Cross-field rules (for example: fewer clients than model groups, a
method that cannot train the listed models) are checked too and named the same way. What each
method takes under `method_args` is listed by `incofl methods`.

Settings are merged, later winning: the top level < `per_dataset.<data set>` < `per_method.<method>`
< a variant's own < `incofl train --set key=value`.
"""
SECTIONS = (  # (title, introduction, model): the keys the model adds to Settings (Settings: its own)
    (
        "The grid and the experiment",
        "The grid is datasets x alphas x methods x seeds; these keys are the experiment's own.",
        ExperimentConfig,
    ),
    ("Settings every run shares", "Overridable per data set, per method, per variant and with `--set`.", Settings),
    (
        "One run's grid point",
        "A run's own `config.yaml` and `incofl train --set` name one point of the grid.",
        RunConfig,
    ),
)


def _type(node: dict[str, Any]) -> str:
    """A schema node in words: its type, enum and bounds."""
    if "anyOf" in node:
        kinds = [n for n in node["anyOf"] if n != {"type": "null"}]
        words = " or ".join(_type(n) for n in kinds)
        return f"{words}, or null (unset)" if len(kinds) < len(node["anyOf"]) else words
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        if name in ("Dataset", "Model"):
            return "one of " + ", ".join(f"`{v}`" for v in (DATASETS if name == "Dataset" else MODELS))
        if name == "Method":
            return "a method (`incofl methods`)"
        if name == "Variant":
            return "a variant's name"
        return f"mapping, see [{_key_of(name)}](#{_key_of(name)})"
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type", "any")
    if kind == "array":
        at_least = f", at least {node['minItems']}" if node.get("minItems") else ""
        return f"list of ({_type(node['items'])}){at_least}"
    if kind == "object":
        return "mapping"
    bounds = [
        f"{op} {node[key]}"
        for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
        if key in node
    ]
    if "pattern" in node:
        bounds.append(f"matching `{node['pattern']}`")
    return " ".join([kind, ", ".join(bounds)]).strip()


def _key_of(def_name: str) -> str:
    return next(key for key, name in NESTED.items() if name == def_name)


def _model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model of a field's annotation (`X` or `X | None`), None for a TypedDict."""
    kinds = getattr(annotation, "__args__", (annotation,))
    return next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see below"
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    return f"`{text}`"


def _rows(props: dict[str, Any], names: list[str], default: Any) -> Iterator[str]:
    for name in names:
        node = props[name]
        what, kind = (text.replace("|", "\\|") for text in (node.get("description", ""), _type(node)))
        yield f"| `{name}` | {kind} | {default(name)} | {what} |"


def _table(props: dict[str, Any], names: list[str], default: Any) -> list[str]:
    return ["| key | type and range | default | meaning |", "|---|---|---|---|", *_rows(props, names, default), ""]


def _own_fields(model: type[BaseModel]) -> list[str]:
    return [n for n in model.model_fields if model is Settings or n not in Settings.model_fields]


def markdown() -> str:
    """The reference of every config key, as config/README.md holds it."""
    schema = config_schema()
    defs = schema["$defs"]
    run = _clean(RunConfig.model_json_schema(mode="validation"))["properties"]
    lines = [MARKDOWN_HEAD]
    for title, intro, model in SECTIONS:
        props = run if model is RunConfig else schema["properties"]
        lines += [f"## {title}", "", intro, ""]
        lines += _table(props, _own_fields(model), lambda n, m=model: _default(m, n))
    for key, def_name in NESTED.items():
        node = defs[def_name]
        lines += [f"## {key}", "", node["description"], ""]
        model = _model(ExperimentConfig.model_fields[key].annotation)
        default = (lambda n: "unset") if model is None else (lambda n, m=model: _default(m, n))  # TypedDict: none
        lines += _table(node["properties"], list(node["properties"]), default)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m incofl.schema", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help=f"print {MARKDOWN_FILE.name}'s key reference")
    parser.add_argument("--write", action="store_true", help=f"write {SCHEMA_FILE} and {MARKDOWN_FILE}")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(markdown() if args.markdown else render())
        return 0
    if not SCHEMA_FILE.parent.is_dir() or not MARKDOWN_FILE.parent.is_dir():
        parser.error(f"{SCHEMA_FILE.parent}: not found (--write needs a source checkout, pip install -e .)")
    for target, text in ((SCHEMA_FILE, render()), (MARKDOWN_FILE, markdown())):
        target.write_text(text)
        print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
