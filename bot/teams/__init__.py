"""Microsoft Teams: the platform primitives (bot.teams.platform) on the Microsoft 365 Agents SDK; docs/teams.md."""
