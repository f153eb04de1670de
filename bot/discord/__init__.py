"""The Discord adapter: Discord interactions in, Discord messages out; everything else is in bot/chat."""
