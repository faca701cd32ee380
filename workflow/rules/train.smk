"""Training: one job per grid point (data set x alpha x method x seed) reading the run's
config file. `incofl train` checkpoints every `checkpoint_every` rounds and resumes from the
run's ckpt.pt when rerun; summary.json is written last and atomically, so it marks a
finished run, diverged ones included (exit code 3)."""


rule train:
    input:
        config=f"{RUN}/config.yaml",
        data=DATA,
        partition=partition_of,
    output:
        f"{RUN}/summary.json",
    log:
        "results/logs/train/{dataset}/a{alpha}/{method}/s{seed}.log",
    benchmark:
        "results/benchmarks/train/{dataset}/a{alpha}/{method}/s{seed}.tsv"
    params:
        run_dir=lambda wc, output: os.path.dirname(output[0]),
    conda:
        SOFTWARE
    threads: run_threads
    resources:
        **train_resources(),
        cpus_per_task=lambda wc, threads: threads,
    shell:
        "incofl train --config {input.config} --out {params.run_dir}"
        " --set partition_file={input.partition} threads={threads} progress=false > {log} 2>&1"
        " || [ $? -eq 3 ]"  # diverged: a finished run (summary.json says so; tables show it)
