"""The workflow's JSON schema is generated from the pydantic models (incofl.schema): the
committed file is what the generator gives now, it has no defaults (Snakemake's validate()
would fill them into the config), and the schema and pydantic agree on bad and shipped configs."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from jsonschema import Draft202012Validator
from snakemake.utils import validate as snakemake_validate

from incofl import schema as gen
from incofl.config import Analyses, ConfigError, ExperimentConfig, Settings, validate_experiment

REPO = Path(__file__).resolve().parents[1]
SCHEMA_FILE = REPO / "workflow" / "schemas" / "config.schema.yaml"
MARKDOWN_FILE = REPO / "config" / "README.md"
TINY = REPO / "tests" / "data" / "tiny.yaml"
CONFIGS = sorted((REPO / "config").glob("*.yaml")) + [TINY]


@pytest.fixture(scope="module")
def schema() -> dict:
    return yaml.safe_load(SCHEMA_FILE.read_text())


def _keys(node, out=None) -> set[str]:
    """Every mapping key at any depth."""
    out = set() if out is None else out
    if isinstance(node, dict):
        out.update(node)
        for v in node.values():
            _keys(v, out)
    elif isinstance(node, list):
        for v in node:
            _keys(v, out)
    return out


def test_committed_schema_is_what_the_generator_gives():
    assert SCHEMA_FILE.read_text() == gen.render(), (
        f"{SCHEMA_FILE.relative_to(REPO)} is stale: run `python -m incofl.schema --write`"
    )


def test_committed_config_reference_is_what_the_generator_gives():
    assert MARKDOWN_FILE.read_text() == gen.markdown(), (
        f"{MARKDOWN_FILE.relative_to(REPO)} is stale: run `python -m incofl.schema --write`"
    )


def test_the_module_prints_and_writes_the_schema_and_the_reference(tmp_path, monkeypatch, capsys):
    assert gen.main([]) == 0
    out = capsys.readouterr().out
    assert out == gen.render() and out.startswith("# Generated") and "incofl.schema --write" in out.splitlines()[0]
    assert gen.main(["--markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown == gen.markdown() and "incofl.schema --write" in markdown.splitlines()[2]
    target, reference = tmp_path / "workflow" / "schemas" / "config.schema.yaml", tmp_path / "config" / "README.md"
    target.parent.mkdir(parents=True)
    reference.parent.mkdir()
    monkeypatch.setattr(gen, "SCHEMA_FILE", target)
    monkeypatch.setattr(gen, "MARKDOWN_FILE", reference)
    assert gen.main(["--write"]) == 0
    assert target.read_text() == out and reference.read_text() == markdown
    assert yaml.safe_load(out) == gen.config_schema()


def _rows() -> dict[str, list[str]]:
    """The reference's table rows: `key` -> [type and range, default, meaning], per section."""
    rows: dict[str, list[str]] = {}
    section = ""
    for line in gen.markdown().splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("| `"):
            key, *cells = (c.strip() for c in line.strip("|").split(" | "))
            rows[f"{section}:{key.strip('`')}"] = cells
    return rows


def test_the_reference_lists_every_key_with_its_default_range_and_description():
    from incofl.studies import CaseStudy, Robustness

    rows = _rows()
    models = {
        "Settings every run shares": Settings,
        "analyses": Analyses,
        "robustness": Robustness,
        "case_study": CaseStudy,
    }
    for section, model in models.items():
        for name, field in model.model_fields.items():
            assert f"{section}:{name}" in rows, f"{section}: {name} missing"
            assert field.description, f"{model.__name__}.{name}: no Field(description=...) for config/README.md"
    for name in [*ExperimentConfig.model_fields, "dataset", "alpha", "method", "seed", "runs_per_gpu", "mem_mb"]:
        assert any(key.endswith(f":{name}") for key in rows), name
    assert rows["Settings every run shares:ratio"][:2] == ["number > 0.0, <= 1.0", "`0.1`"]
    assert rows["Settings every run shares:holdout"][:2] == ["number >= 0.0, < 1.0", "`0.0`"]
    assert rows["Settings every run shares:optimizer"][:2] == ["one of `adam`, `sgd`", "`adam`"]
    assert rows["Settings every run shares:cutout"][:2] == ["integer >= 0, or null (unset)", "`null`"]
    assert rows["Settings every run shares:models"][1] == "`[resnet10, resnet14, resnet18, resnet22, resnet26]`"
    assert rows["The grid and the experiment:alphas"][:2] == ["list of (number > 0.0), at least 1", "`[0.5]`"]
    assert rows["analyses:tsne_groups"][:2] == ["list of (integer >= 0), at least 1", "`[3, 4, 4]`"]
    assert rows["resources:runs_per_gpu"][:2] == ["integer >= 1", "unset"]
    assert "mapping, see [analyses](#analyses)" in rows["Settings every run shares:analyses"][0]


def test_schema_has_no_defaults_and_is_a_valid_2020_12_schema(schema):
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == Draft202012Validator.META_SCHEMA["$schema"]  # else Snakemake warns
    assert "default" not in _keys(schema), "defaults belong to the pydantic model only"
    assert "title" not in _keys(schema)
    assert "pydantic is the one place for them" in schema["description"]
    assert schema["additionalProperties"] is False


def test_enums_come_from_the_registries(schema):
    """Data sets and models are enums of their lists; methods are names only, so a method the
    registry collects from a new family folder needs no regeneration (the workflow accepts it:
    tests/test_workflow.py), and an unknown one is the config validation's refusal (BAD below)."""
    from incofl.config import DATASETS
    from incofl.models.names import MODELS

    defs = schema["$defs"]
    assert defs["Dataset"]["enum"] == list(DATASETS)
    assert defs["Model"]["enum"] == list(MODELS)
    assert "enum" not in defs["Method"] and "enum" not in defs["Variant"]
    props = schema["properties"]
    assert props["datasets"]["items"] == {"$ref": "#/$defs/Dataset"}
    assert props["models"]["items"] == {"$ref": "#/$defs/Model"}
    assert props["methods"]["items"] == {"$ref": "#/$defs/Method"}  # or a variant's name (tests/test_variants.py)
    assert props["per_method"]["propertyNames"] == {"$ref": "#/$defs/Method"}


BAD = [
    ({"ratio": 1.5}, "ratio"),
    ({"ratio": 0}, "ratio"),
    ({"alphas": [0.5, 0]}, "alphas"),
    ({"seeds": [0, -1]}, "seeds"),
    ({"learning_rate": 0.1}, "learning_rate"),  # unknown key
    ({"methods": ["FedAvg", "No such method"]}, "methods"),  # a name (the registry's check: BAD_NAMES)
    ({"models": ["resnet10", "resnet99"]}, "models"),
    ({"datasets": ["imagenet"]}, "datasets"),
    ({"eval_every": 0}, "eval_every"),
    ({"lr": -1}, "lr"),
    ({"momentum": 1.0}, "momentum"),
    ({"threads": 0}, "threads"),
    ({"optimizer": "rmsprop"}, "optimizer"),
    ({"per_method": {"No/such": {"rounds": 1}}}, "per_method"),
    ({"resources": {"gpu": -1}}, "resources"),
    ({"resources": {"cpus": 4}}, "resources"),  # unknown resource
]


@pytest.mark.parametrize("override,key", BAD, ids=[str(o) for o, _ in BAD])
def test_schema_and_pydantic_both_refuse_a_bad_config(schema, override, key):
    base = yaml.safe_load(TINY.read_text())
    jsonschema.validate(base, schema, cls=Draft202012Validator)  # the base is valid on both sides
    validate_experiment(base)
    cfg = {**base, **override}
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.validate(cfg, schema, cls=Draft202012Validator)
    path = list(err.value.absolute_path)
    assert (path and path[0] == key) or key in err.value.message, (path, err.value.message)
    with pytest.raises(ConfigError) as err:
        validate_experiment(cfg, "c.yaml")
    msg = str(err.value)
    assert key in msg and "\n" not in msg


BAD_NAMES = [({"methods": ["FedAvg", "NoSuchMethod"]}, "methods"), ({"per_method": {"NoSuchMethod": {}}}, "per_method")]


@pytest.mark.parametrize("override,key", BAD_NAMES, ids=[str(o) for o, _ in BAD_NAMES])
def test_an_unregistered_method_is_refused_by_the_config_validation(schema, override, key):
    """A well-formed name the registry does not hold passes the schema (which lists no methods)
    and is refused by pydantic, which the workflow runs right after it (one line, exit 2)."""
    cfg = {**yaml.safe_load(TINY.read_text()), **override}
    jsonschema.validate(cfg, schema, cls=Draft202012Validator)
    with pytest.raises(ConfigError, match=f"{key}.*unknown method 'NoSuchMethod'"):
        validate_experiment(cfg, "c.yaml")


def test_pydantic_defaults_pass_the_schema(schema):
    jsonschema.validate(ExperimentConfig().model_dump(mode="json"), schema, cls=Draft202012Validator)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_pass_both(schema, path):
    raw = yaml.safe_load(path.read_text())
    jsonschema.validate(raw, schema, cls=Draft202012Validator)
    validate_experiment(raw, str(path))
    # as the workflow validates: Snakemake's validate() (its $ref registry, default filling)
    cfg = copy.deepcopy(raw)
    snakemake_validate(cfg, str(SCHEMA_FILE))
    assert cfg == raw, "Snakemake's validate() changed the config: the schema must not hold defaults"


def test_snakemake_validate_resolves_refs_and_refuses(tmp_path):
    """The $defs are reached through Snakemake's reference resolution too."""
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError) as err:
        snakemake_validate({"methods": ["No such method"]}, str(SCHEMA_FILE))
    cause = err.value.__context__
    assert isinstance(cause, jsonschema.ValidationError) and list(cause.absolute_path) == ["methods", 0]
