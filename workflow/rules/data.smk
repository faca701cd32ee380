"""Data: decode a data set once, then one client partition per data set x alpha x clients x
partition seed, which every method and training seed reads."""


rule prepare:
    output:
        DATA,
    log:
        "results/logs/prepare/{dataset}.log",
    params:
        sets=lambda wc: cli_sets(data_settings(wc)),
    conda:
        SOFTWARE
    shell:
        "incofl prepare --set {params.sets} > {log} 2>&1"


rule partition:
    input:
        partition_inputs,
    output:
        PARTITION,
    log:
        "results/logs/partition/{dataset}/a{alpha}-k{clients}-p{pseed}.log",
    params:
        sets=lambda wc: cli_sets(partition_settings(wc)),
    conda:
        SOFTWARE
    shell:
        "incofl partition --out {output} --set {params.sets} > {log} 2>&1"
