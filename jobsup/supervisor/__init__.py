"""`jobsup start`: the supervisor process and its isolated workers.

The modules, one job each:

- main: `jobsup start`'s entry: binds the metrics port, spawns the workers, then connects and runs.
- supervisor: the one asyncio loop: wires the keeper, the dispatcher and the duties; the shutdown.
- config: the supervisor's settings and their defaults.
- keeper: the process keeper: spawns, watches, times out, recycles and restarts the workers (the worker
  process itself, and the messages on their pipes, are jobsup.worker's).
- dispatcher: builds the rooms below, and turns a worker's answer or death, or an operator's cancel,
  into an outcome; the one object the supervisor and the duties talk to about jobs.
- claimer: claims what the workers can start soon, with the limited planner; wakes for NOTIFYs and run_at.
- handout: the prefetch, and which worker process starts each job (alone or shared).
- writer: the outcome writer: buffers each outcome by its statement and writes them in batches.
- renewer: renews the lease of every held job.
- held: what the supervisor holds, from claim to written outcome.
- pace: how long handlers run and how fast jobs finish.
- wakeup: the flag the loops wait on.
- keys: where each queue's next claim starts.
- link: a connection of the supervisor that reconnects with backoff.
- log: one log line per lifecycle event.
- tally: what the supervisor counts for --metrics-port.
- duty: the start/stop protocol of the duties, and the maintainer that runs them in order.
- listener: duty: LISTEN; each NOTIFY decoded (jobsup.db.notify) and routed by its type to the
  dispatcher and the scheduler.
- reaper: duty: returns the jobs whose lease expired, forgets supervisors that are gone.
- roster: which supervisors' rows are gone (for the reaper).
- heartbeat: duty: this supervisor's row for the console; reads back the paused queues.
- scheduler: duty: enqueues the fires of the app's schedules.
- pruner: duty: deletes finished history past its retention window.
- exporter: duty: /metrics and /healthz on --metrics-port.
- declaration: records the app's limits before the first claim.
- worker, wire, sharing; limits, metrics: the old paths of jobsup.worker's modules and of declaration
  and exporter, which warn for one release.

It may import jobsup.worker, jobsup.db, jobsup.ops and the public modules (jobsup.app, jobsup.client, jobsup.job,
jobsup.errors, ...); never jobsup.monitor or jobsup.cli, which are built on top of it or beside it.
"""
