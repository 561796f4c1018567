"""What a model_path holds, read and written in one place, without TensorFlow for reading:

    model.ckpt-STEP.index/.data-*, checkpoint   checkpoints.py      the checkpoints, their steps and the newest
    .trainer.lock                               lock.py             the one trainer that owns the folder
    tokenizer_id.json                           tokenizer_record.py the tokenizer of the data it trained on
    run_info.json                               run_info.py         the run's shape, FLOPs and starts
    eval_results.jsonl                          eval_results.py     every evaluation of a checkpoint
    events.out.tfevents.*, eval/                events.py           TensorBoard scalars, written and read
(files.py: the file operations, local or in a bucket.) Jobs write through these; tools/plot_runs.py,
run_experiment.py and the ladder read through them."""
