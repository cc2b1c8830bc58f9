"""What a job may ask before any strategy is searched: what the installation lets it ask of the
scheduler (`scheduling_policy`), claims every pod can share (`storage`), a download cache that
holds the model (`model_bytes`)."""
