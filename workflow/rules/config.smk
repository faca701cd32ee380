"""Config files, written by jobs so that a dry run writes nothing: the validated experiment
(for the report jobs) and one file per run (what its training job reads). Shell jobs, as a
run: job would start a Python process that parses the whole workflow again."""


rule experiment_config:
    output:
        CONFIG,
    log:
        "results/logs/config/experiment.log",
    params:
        config=as_yaml(EXP.model_dump(mode="json")),
    conda:
        SOFTWARE
    localrule: True
    shell:
        "printf '%s' {params.config:q} > {output} 2> {log}"


rule run_config:
    """A run's config file; rewritten (and the run redone) only when the run's own settings
    change."""
    output:
        f"{RUN}/config.yaml",
    log:
        "results/logs/config/{dataset}/a{alpha}/{method}/s{seed}.log",
    params:
        config=lambda wc: as_yaml(run_file(wc)),
    conda:
        SOFTWARE
    localrule: True
    shell:
        "printf '%s' {params.config:q} > {output} 2> {log}"
