"""Use cases several front ends share, and the named interfaces they meet through: the
job writer, imports and previews, the extensions and notifier-transport entry points,
and the signals about failing jobs."""
