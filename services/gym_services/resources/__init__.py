"""Resources and environment servers, one package each; ``common/`` holds their session participant."""
