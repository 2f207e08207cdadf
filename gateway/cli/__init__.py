"""The `switchyard` command line, off the request path: its commands (`main`), the A/B report
(`ab_report`), the plugin scaffold (`scaffold`) and the conformance check of a configured
backend (`plugin_check`)."""
