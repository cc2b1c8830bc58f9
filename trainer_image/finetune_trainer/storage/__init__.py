"""Where a job's URIs live in a pod (`paths`) and the trainer's S3 client (`objstore`)."""
