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
        code=TRAINING_CODE,
    conda:
        SOFTWARE
    group:
        TRAIN_GROUP  # resources.runs_per_gpu > 1: N runs per SLURM job (common.smk)
    threads: run_threads
    resources:
        **train_resources(),
        cpus_per_task=lambda wc, threads: threads,
    shell:
        "incofl train --config {input.config} --out {params.run_dir}"
        " --set partition_file={input.partition} threads={threads} progress=false > {log} 2>&1"
        " || [ $? -eq 3 ]"  # diverged: a finished run (summary.json says so; tables show it)


rule train_batch:
    """resources.runs_per_gpu N > 1: the record of a batch of N runs (their summaries, the SLURM
    job and GPUs they shared). Reading the N summaries, it ties their training jobs into one
    connected job group: one SLURM job whose N runs train side by side (common.smk)."""
    input:
        batch_runs,
    output:
        BATCH,
    log:
        "results/logs/train/batches/b{batch}.log",
    conda:
        SOFTWARE
    group:
        TRAIN_GROUP
    resources:
        runtime=1,  # added to the runs' runtime in the group's time limit
        mem_mb=100,
        cpus_per_task=1,
    shell:
        "{{ echo slurm_job=${{SLURM_JOB_ID:-}} host=$(hostname) gpus=${{CUDA_VISIBLE_DEVICES:-}};"
        " printf '%s\\n' {input}; }} > {output} 2> {log}"
