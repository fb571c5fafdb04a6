"""The comparison harness: every registered sharder on a suite of tasks, with reports."""
