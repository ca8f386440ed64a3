from jobsup import queue


def test_enqueue_claim_complete(conn):
    job_id = queue.enqueue(conn, "email", {"to": "a@example.com"})
    [job] = queue.claim(conn, ["default"], 10, "sup-a", 30)
    assert (job.id, job.attempts, job.payload) == (job_id, 1, {"to": "a@example.com"})
    assert queue.complete(conn, [(job.id, job.attempts)], "sup-a") == [job_id]
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()[0] == "done"
