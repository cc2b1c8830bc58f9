"""The trainer that runs inside every pod of a FineTuneJob."""
