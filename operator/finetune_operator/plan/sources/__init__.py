"""Where a job's model comes from: its config.json and weight bytes read from the hub or a folder
(`model_files`), or the built-in catalogue (`model_source`)."""
