"""The paper's analyses (docs/analyses.md; config/analysis.yaml): figures and tables from the
grid's runs (their observers' files: cka.csv, gradients.csv, tsne.csv, inco.csv) and from the
runs of the studies beside the grid (robustness: batch size and update noise; case study: IID /
non-IID x homogeneous / heterogeneous), each study run a training job of its own. Outputs in
results/analysis/<analysis>/, shown in `snakemake --report` with captions."""


rule study_config:
    """A study run's config file (incofl.studies); rewritten only when its settings change."""
    output:
        f"{STUDY_RUN}/config.yaml",
    log:
        "results/logs/config/{study}/{point}/s{seed}.log",
    params:
        config=lambda wc: as_yaml(config_file(study_config(wc))),
    conda:
        SOFTWARE
    localrule: True
    shell:
        "printf '%s' {params.config:q} > {output} 2> {log}"


rule study_train:
    """One study run; its partition is drawn in the job (the studies vary the partition)."""
    input:
        config=f"{STUDY_RUN}/config.yaml",
        data=lambda wc: DATA.format(dataset=wc.point.split("/")[0]),
    output:
        f"{STUDY_RUN}/summary.json",
    log:
        "results/logs/train/{study}/{point}/s{seed}.log",
    benchmark:
        "results/benchmarks/train/{study}/{point}/s{seed}.tsv"
    params:
        run_dir=lambda wc, output: os.path.dirname(output[0]),
        code=TRAINING_CODE,
    conda:
        SOFTWARE
    threads: lambda wc: study_config(wc).threads or 1
    resources:
        **train_resources(),
        cpus_per_task=lambda wc, threads: threads,
    shell:
        "incofl train --config {input.config} --out {params.run_dir}"
        " --set threads={threads} progress=false > {log} 2>&1"
        " || [ $? -eq 3 ]"  # diverged: a finished run (summary.json says so)


# One rule per analysis, named for what it computes (`snakemake cka` makes results/analysis/cka).
for _analysis in (*GRID_ANALYSES, *STUDIES):

    rule:
        """`incofl analysis <name>` over the grid's runs (cka, gradients, theta_beta, tsne,
        groups) or over a study's runs (robustness, case_study)."""
        name:
            _analysis
        input:
            runs=lambda wc, name=_analysis: analysis_runs(name),
            config=CONFIG,
        output:
            report(directory(f"{ANALYSIS}/{_analysis}"), patterns=["{name}.png"], caption="../report/analysis.rst",
                   category="Analyses", subcategory=_analysis),
        log:
            f"results/logs/analysis/{_analysis}.log",
        params:
            command=lambda wc, input, name=_analysis: analysis_command(name, input),
        conda:
            SOFTWARE
        localrule: True
        shell:
            "{params.command} --out {output} > {log} 2>&1"
