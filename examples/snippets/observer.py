"""docs/events.rst: an observer of ojs_kombu's named moments."""

# [observer]
import logging

import ojs_kombu

log = logging.getLogger("proj")


class SlowJobs(ojs_kombu.Observer):
    def job_completed(self, job, duration_s, result):
        if duration_s > 5:
            log.warning("%s %s took %.1fs", job.job_type, job.job_id, duration_s)
# [/observer]
