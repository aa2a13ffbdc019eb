"""metricslog — reading a run's metrics.jsonl, for the scripts beside it."""
import json


def records(path):
    """The JSON records of the file at path, in order; a line that does not
    parse (cut by a stop) is skipped."""
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line cut by a stop
