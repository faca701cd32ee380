"""The reproduction workflow (docs/workflow.md, "The reproduction workflow"):

    config --validate--> prepare (resources/data) --> partition (results/partitions)
      --> train (results/runs) --> table, metrics.json, figures, curve data (results/)
      (--> analyses, study runs in results/studies --> results/analysis/<analysis>/)

    snakemake --cores 2                                          # config/config.yaml
    snakemake --cores 2 --config experiment=config/ablation.yaml # another experiment
    snakemake --profile profiles/slurm --config experiment=config/paper-resnet.yaml
    snakemake --report results/report.html                   # after a run
"""

from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/config.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/analysis.smk"


rule all:
    default_target: True
    input:
        all_targets(),


rule runs:
    """The grid's runs only (`snakemake runs`: DVC's training stage of this config)."""
    input:
        RUNS,
