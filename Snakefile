"""The reproduction workflow (docs/workflow.md, "The reproduction workflow"):

    config --validate--> prepare (resources/data) --> partition (results/partitions)
      --> train (results/runs) --> table, metrics.json, figures, curve data (results/)
      (--> analyses, study runs in results/studies --> results/analysis/<analysis>/)

    snakemake --cores 2                                      # config/config.yaml
    snakemake --cores 2 --configfile config/ablation.yaml    # another experiment
    snakemake --profile profiles/slurm --configfile config/paper-resnet.yaml
    snakemake --report results/report.html                   # after a run
"""

from snakemake.utils import min_version

min_version("9.0")


# The default config only when no --configfile is given: Snakemake would otherwise merge
# the given file into it, and keys that file leaves out would come from config/config.yaml.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


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
