"""The Slack adapter: Slack events in, Slack messages out; everything else is in bot/chat."""
