"""Aggregate: Table 2 (md, tex, csv, html: the report shows the html) with results/metrics.json, the figures, the curve data
for `dvc plots`, and FedPart's poster table when the grid has partial methods. Light jobs: they run where Snakemake runs, also under SLURM."""


rule table:
    input:
        runs=RUNS,
        config=CONFIG,
    output:
        md=report(TABLES[0], caption="../report/table2.rst", category="Table 2"),
        tex=TABLES[1],
        csv=report(TABLES[2], caption="../report/table2.rst", category="Table 2"),
        html=report(TABLES[3], caption="../report/table2.rst", category="Table 2"),
        metrics=METRICS,
    log:
        "results/logs/report/table.log",
    params:
        runs=runs_root,
        out=lambda wc, output: os.path.dirname(output.md),
    conda:
        SOFTWARE
    localrule: True
    shell:
        "incofl table --config {input.config} --runs {params.runs} --out {params.out}"
        " --metrics {output.metrics} > {log} 2>&1"


rule figures:
    input:
        runs=RUNS,
        config=CONFIG,
    output:
        png=[report(p, caption="../report/figures.rst", category="Figures") for p in figures("png")],
        pdf=figures("pdf"),
    log:
        "results/logs/report/figures.log",
    params:
        runs=runs_root,
        out=lambda wc, output: os.path.dirname(output.pdf[0]),
    conda:
        SOFTWARE
    localrule: True
    shell:
        "incofl figures --config {input.config} --runs {params.runs} --out {params.out} > {log} 2>&1"


rule fedpart_table:
    input:
        runs=RUNS,
        config=CONFIG,
    output:
        report(FEDPART_TABLE, caption="../report/fedpart.rst", category="FedPart"),
    log:
        "results/logs/report/fedpart.log",
    params:
        runs=runs_root,
        out=lambda wc, output: os.path.dirname(output[0]),
    conda:
        SOFTWARE
    localrule: True
    shell:
        "incofl fedpart --config {input.config} --runs {params.runs} --out {params.out} > {log} 2>&1"


rule plot_data:
    input:
        RUNS,
    output:
        PLOT_DATA,
    log:
        "results/logs/report/plot_data.log",
    conda:
        SOFTWARE
    localrule: True
    script:
        "../scripts/plot_data.py"
