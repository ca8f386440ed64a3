from jobsup import client
from jobsup.db import lifecycle


def test_enqueue_claim_complete(conn):
    job_id = client.enqueue(conn, "email", {"to": "a@example.com"})
    [job] = lifecycle.claim(conn, ["default"], 10, "sup-a", 30)
    assert (job.id, job.attempts, job.payload) == (job_id, 1, {"to": "a@example.com"})
    assert lifecycle.complete(conn, [(job.id, job.attempts)], "sup-a") == [job_id]
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()[0] == "done"
