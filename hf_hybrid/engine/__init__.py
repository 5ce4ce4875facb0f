"""The predictive-training algorithm in plain PyTorch; never imports transformers.

How one step flows, from the Trainer's loop to the optimizer step (a plain loop makes the same calls).
On the first micro-batch of an optimizer step the Trainer fires `on_step_begin`: `HybridStepCallback`
calls `HybridOptimizer.begin_step(global_step + 1)`, which starts the step's measurements empty and asks
`HybridEngine.begin_step` for the `StepPlan` (the phase, and whether to measure the loss). For every
micro-batch `training_step` reads that plan: a real phase runs the plain `training_step` (forward and
backward), a checked predicted step a forward only (`compute_loss` under no_grad), a blind one nothing;
each measured loss goes to `HybridOptimizer.add_loss`. In real steps the loop's gradient norm goes to
`HybridOptimizer.set_grad_norm` (predicted steps have no gradient and clip nothing). The loop then calls
`optimizer.step()` where it always does: `HybridOptimizer.step` averages the losses over ranks into a
`StepRecord` and hands it, with the wrapped optimizer's `step`, to `HybridEngine.finish_step`, which
runs the real step (checks and the spike guard's verdict, the optimizer step unless the batch was blamed,
what the predictor learns) or writes the predicted update through the guard, and performs the one
`RecoveryAction` the step's alarms call for. Its
`StepOutcome` goes to `on_outcome` (the trainer's timeline row); the schedule then steps as always.
"""
