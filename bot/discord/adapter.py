"""The Discord adapter: `/ask`, `@ragbot` mentions answered in threads, DMs, `/kb` admin commands, 👍/👎 feedback.

discord.py does the platform work (gateway, slash command tree, rate limits, persistent components); this module
turns Discord events into an `Ask` for the shared chat flow (`bot.chat.flow`) and renders the answer within
Discord's limits (`ProgressiveReply` is the flow's `Reply`). Claiming events, audiences, the answer itself, errors,
admin actions and feedback are the flow's, shared with Slack.

Audiences (Discord has no email, so a person's documents come from the identity map an admin maintains, expanded
through the synced groups by the one resolver, `kb.principals_for`):
- a channel @everyone may view, a thread in it, or `/ask` there: `everyone` plus the principals granted to it;
- a channel hidden from @everyone by its permission overwrites (and its threads): what EVERY member who may view
  it may see (bot.chat.audience): guild members from the gateway cache or `GET /guilds/{id}/members` (the Server
  Members intent switched on in the Developer Portal), filtered by `channel.permissions_for(member).view_channel`;
  recomputed on member/role/channel updates and at least every CHANNEL_AUDIENCE_TTL;
- a DM, or `/ask private:True` (an ephemeral answer only the asker sees; the default in a channel whose mode is
  private): the asker's principals. A private answer carries a "Share in channel" button that answers again for
  the channel.

Every question is claimed as a lease (`bot.chat.lease`): a DM or a mention by its message id, `/ask` (public or
private) by its interaction id, with the interaction's follow-up token stored beside it, so that if the process
dies mid-answer the sweeper of another `ragbot run` finishes the answer through the same interaction (ephemerally
when it was private). Discord's interaction tokens last 15 minutes: an `/ask` not finished by then is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import discord
import yarl
from discord import app_commands

from bot.chat.audience import AudienceUnavailable, Member
from bot.chat.errors import new_error_id
from bot.chat.feedback import parse_rating
from bot.chat.flow import SHARE_NOT_YOURS, Ask, ChatFlow, CommandUser, OnText
from bot.chat.guests import MEMBER, Standing
from bot.chat.history import PRIOR_MESSAGES_LIMIT, ThreadMessage
from bot.chat.lease import start_sweeper, stop_sweeper
from bot.chat.readers import AnswerTarget, AudienceRule, PersonInfo, Readers
from bot.chat.render import SHARE_LABEL, SOURCES_TITLE, SourceEntry, answer_view, sources_list, split_text
from bot.chat.sanitize import quote_safe
from bot.chat.state import BotState
from bot.server import StartupError
from bot.settings import BotSettings
from knowledge import ChatMessage

if TYPE_CHECKING:
    from collections.abc import Mapping

    from bot.chat.channels import ChannelSettings
    from bot.chat.flow import Reply
    from bot.chat.state import LeaseClaim, PendingQuestion, Rating
    from bot.context import BotContext
    from bot.server import BotMetrics
    from knowledge import Answer, KnowledgeBase

logger = logging.getLogger(__name__)

MESSAGE_LIMIT = 2000  # characters of message content
EMBED_DESCRIPTION_LIMIT = 4096
EMBED_TOTAL_LIMIT = 6000  # all embeds of one message together
EMBEDS_PER_MESSAGE = 10
THREAD_NAME_LIMIT = 100
NO_PINGS = discord.AllowedMentions.none()
PLATFORM = "discord"
GUILD_MEMBERS_PAGE = 1000  # GET /guilds/{id}/members: at most 1000 per page, paged by `after`
MAX_GUILD_MEMBERS_SCANNED = 10_000  # a bigger server: a restricted channel's audience falls back to everyone
# An interaction token lets the bot post follow-ups for 15 minutes (Discord: "Receiving and Responding"); a resumed
# `/ask` must be finished well before that.
INTERACTION_TOKEN_SECONDS = 15 * 60
INTERACTION_RESUME_MARGIN = 60.0
# The start-up sweep runs at login, before the gateway has sent the servers (READY): a resumed answer in a channel
# waits this long for them, since its readers are the channel's members from that cache.
READY_WAIT_SECONDS = 5.0  # within the default 10 s lease the sweep took


def configure_api_url(url: str | None) -> None:
    """Point discord.py's REST client (bot calls, interaction callbacks, follow-up webhooks) at another base URL.

    discord.py copies the class attribute `Route.BASE` into every route when it is created, so this must run
    before the client makes its first request (`ragbot run` and the tests call it before `login`)."""
    if url:
        discord.http.Route.BASE = url.rstrip("/")


def configure_gateway_url(url: str | None) -> None:
    """Point discord.py's gateway connection at another websocket URL (discord.py 2.x connects a plain Client to
    the class attribute `DiscordWebSocket.DEFAULT_GATEWAY`, without asking the REST API)."""
    if url:
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(url)


# ---- rendering ----------------------------------------------------------------------------------------------------


def discord_safe(text: str) -> str:
    """Document-derived text as Discord should show it: `quote_safe` (no control characters, mentions or masked
    links), then discord.py's own mention escaping for the id forms (`@123…`). allowed_mentions=none is sent with
    every message as well, so even text that slipped through pings nobody."""
    return discord.utils.escape_mentions(quote_safe(text))


def _link_text(title: str) -> str:
    return discord.utils.escape_markdown(title).replace("[", "(").replace("]", ")")


def _safe_url(url: str) -> str:
    """Characters that would end a masked link, encoded (`sources_list` already kept only http(s) URLs)."""
    return url.replace("(", "%28").replace(")", "%29").replace(" ", "%20")


def source_line(entry: SourceEntry) -> str:
    """`**[n]** [Title](url)`, or the title and its path when the document has no URL. Entries come from
    `bot.chat.render.sources_list`, already `quote_safe`; Discord's own mention escaping and markdown escaping go on top."""
    title = discord.utils.escape_mentions(entry.title)
    if entry.url:
        return f"**[{entry.n}]** [{_link_text(title)}]({_safe_url(entry.url)})"
    line = f"**[{entry.n}]** {discord.utils.escape_markdown(title)}"
    if entry.location and entry.location != entry.title:
        line += f" · `{discord.utils.escape_mentions(entry.location).replace('`', 'ʼ')}`"
    return line


def source_embeds(citations: Sequence[Any], title: str = SOURCES_TITLE) -> list[discord.Embed]:
    """An answer's citations as Sources embeds."""
    return entry_embeds(sources_list(citations), title)


def entry_embeds(entries: Sequence[SourceEntry], title: str = SOURCES_TITLE) -> list[discord.Embed]:
    """Documents as embeds with linked titles, each description within Discord's 4,096 characters."""
    lines = [line for entry in entries for line in [source_line(entry), *(
        f"> *{discord.utils.escape_markdown(discord.utils.escape_mentions(q))}*" for q in entry.quotes)]]
    embeds: list[discord.Embed] = []
    for description in split_text("\n".join(lines), EMBED_DESCRIPTION_LIMIT):
        embeds.append(discord.Embed(title=title if not embeds else None, description=description,
                                    colour=discord.Colour.blurple()))
    return embeds


def _embed_size(embed: discord.Embed) -> int:
    return len(embed)


def group_embeds(embeds: Sequence[discord.Embed]) -> list[list[discord.Embed]]:
    """Embeds per message: at most 10, and at most 6,000 characters of embed text together."""
    groups: list[list[discord.Embed]] = []
    size = 0
    for embed in embeds:
        if not groups or len(groups[-1]) >= EMBEDS_PER_MESSAGE or size + _embed_size(embed) > EMBED_TOTAL_LIMIT:
            groups.append([])
            size = 0
        groups[-1].append(embed)
        size += _embed_size(embed)
    return groups


@dataclass(frozen=True)
class Part:
    content: str | None
    embeds: list[discord.Embed]


def render_answer(answer: Answer, *, private: bool = False) -> list[Part]:
    """The final answer as Discord messages: text split at 2,000 characters (never inside a link or a citation),
    then the sources embed(s) on the last message. What to show is the core's decision (`answer_view`): the
    sources or a decline's closest documents, the offline note, a private answer's note."""
    view = answer_view(answer, private=private)
    text = discord_safe(view.text)
    if view.note:
        text += f"\n\n*{view.note}*"
    if view.private_note:
        text += f"\n\n*{view.private_note}*"
    texts = split_text(text, MESSAGE_LIMIT) or [""]
    parts = [Part(t, []) for t in texts]
    groups = group_embeds(entry_embeds(view.sources, view.sources_title) if view.sources else [])
    if groups:
        parts[-1] = Part(parts[-1].content, groups[0])
        parts.extend(Part(None, group) for group in groups[1:])
    return parts


def preview(text: str) -> str:
    """What a message shows while the answer streams in: the text so far (cut to fit one message) and `…`."""
    shown = discord_safe(text)
    if len(shown) > MESSAGE_LIMIT - 2:
        shown = split_text(shown, MESSAGE_LIMIT - 2)[0]
    return shown + " …"


# ---- feedback buttons -----------------------------------------------------------------------------------------------


class FeedbackButton(discord.ui.DynamicItem[discord.ui.Button], template=r"ragbot:fb:(?P<answer>\d+):(?P<vote>up|down)"):
    """👍 / 👎 under an answer. The custom_id carries the delivered answer's id and the vote, and the class is
    registered with `add_dynamic_items` at start, so a click on a message posted before a restart still works."""

    def __init__(self, answer_id: int, vote: Rating) -> None:
        self.answer_id = answer_id
        self.vote = vote
        super().__init__(discord.ui.Button(
            style=discord.ButtonStyle.secondary, emoji="👍" if vote == "up" else "👎",
            custom_id=f"ragbot:fb:{answer_id}:{vote}",
        ))

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Item[Any],
                             match: re.Match[str]) -> FeedbackButton:
        vote = parse_rating(match["vote"])
        assert vote is not None  # the template matches only up|down
        return cls(int(match["answer"]), vote)

    async def callback(self, interaction: discord.Interaction) -> None:
        client = interaction.client
        assert isinstance(client, RagbotDiscord)
        await client.record_feedback(interaction, self.answer_id, self.vote)


def feedback_view(answer_id: int) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    view.add_item(FeedbackButton(answer_id, "up"))
    view.add_item(FeedbackButton(answer_id, "down"))
    return view


class ShareButton(discord.ui.DynamicItem[discord.ui.Button], template=r"ragbot:share:(?P<answer>\d+)"):
    """"Share in channel" under a private (ephemeral) answer: answers the same question again with the channel's
    audience and posts that for everyone. Registered with `add_dynamic_items`, so it survives a restart."""

    def __init__(self, answer_id: int) -> None:
        self.answer_id = answer_id
        super().__init__(discord.ui.Button(style=discord.ButtonStyle.primary, label=SHARE_LABEL,
                                           custom_id=f"ragbot:share:{answer_id}"))

    @classmethod
    async def from_custom_id(cls, interaction: discord.Interaction, item: discord.ui.Item[Any],
                             match: re.Match[str]) -> ShareButton:
        return cls(int(match["answer"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        client = interaction.client
        assert isinstance(client, RagbotDiscord)
        await client.share_answer(interaction, self.answer_id)


def private_view(answer_id: int) -> discord.ui.View:
    view = feedback_view(answer_id)
    view.add_item(ShareButton(answer_id))
    return view


# ---- progressive answers ------------------------------------------------------------------------------------------

Send = Callable[..., Awaitable[Any]]  # channel.send / followup.send, returning a message with .edit()


class ProgressiveReply:
    """Posts the answer as it streams, then edits that message at most every `interval` seconds (Discord allows
    about five edits per five seconds per channel; discord.py waits out any 429 itself). `finish` replaces the
    preview with the final, split answer; `fail` with an apology, so no half-written message is left behind."""

    def __init__(self, send: Send, interval: float, message: Any = None) -> None:
        self._send = send
        self._interval = interval
        self._text = ""
        self._shown = ""
        self._changed = asyncio.Event()
        self._stopped = asyncio.Event()  # an Event, not a bool: set by stop() while _show_loop awaits
        self._task: asyncio.Task[None] | None = None
        self.message: Any = message  # given: a message posted before a crash, which the answer replaces

    @property
    def placeholder(self) -> str | None:
        """The id of the message the answer is streaming into, stored with the claim (`bot.chat.lease`)."""
        return str(self.message.id) if self.message is not None else None

    # The chat flow's `Reply`: the text is shown as it streams, then replaced by the final answer.

    async def begin(self) -> None:
        return None

    async def open(self) -> OnText:
        return self.on_text

    async def end(self) -> None:
        return None

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        await self.finish(render_answer(answer), feedback_view(answer_id))

    async def on_text(self, delta: str) -> None:
        self._text += delta
        self._changed.set()
        if self._task is None:
            self._task = asyncio.create_task(self._show_loop(), name="ragbot-discord-stream")

    async def _show_loop(self) -> None:
        while not self._stopped.is_set():
            await self._changed.wait()
            self._changed.clear()
            if self._stopped.is_set():
                return
            await self._show()
            await asyncio.sleep(self._interval)

    async def _show(self) -> None:
        shown = preview(self._text)
        if not self._text.strip() or shown == self._shown:
            return
        if self.message is None:
            self.message = await self._send(content=shown, allowed_mentions=NO_PINGS)
        else:
            await self.message.edit(content=shown, allowed_mentions=NO_PINGS)
        self._shown = shown

    async def stop(self) -> None:
        """Stop editing; an edit already under way finishes first."""
        self._stopped.set()
        self._changed.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:  # a failed preview edit must not lose the final answer
                logger.warning("discord: a streaming preview edit failed", exc_info=True)

    async def finish(self, parts: list[Part], view: discord.ui.View | None) -> list[Any]:
        await self.stop()
        sent: list[Any] = []
        for i, part in enumerate(parts):
            kwargs: dict[str, Any] = {"embeds": part.embeds, "allowed_mentions": NO_PINGS}
            if part.content is not None:
                kwargs["content"] = part.content
            if i == len(parts) - 1 and view is not None:
                kwargs["view"] = view
            if i == 0 and self.message is not None:
                await self.message.edit(**kwargs)
                sent.append(self.message)
            else:
                sent.append(await self._send(**kwargs))
        return sent

    async def fail(self, text: str) -> None:
        await self.stop()
        if self.message is not None:
            await self.message.edit(content=text, embeds=[], allowed_mentions=NO_PINGS)
        else:
            await self._send(content=text, allowed_mentions=NO_PINGS)


class PrivateReply(ProgressiveReply):
    """A private (ephemeral) answer in a server: the same as any answer, plus the "Share in channel" button."""

    async def deliver(self, answer: Answer, answer_id: int) -> None:
        await self.finish(render_answer(answer, private=True), private_view(answer_id))


# ---- the client ---------------------------------------------------------------------------------------------------


class RagbotDiscord(discord.Client):
    def __init__(self, kb: KnowledgeBase, settings: BotSettings, metrics: BotMetrics | None = None,
                 state: BotState | None = None) -> None:
        intents = discord.Intents.default()  # guilds, guild and DM messages; no members or presences
        intents.message_content = settings.discord_message_content
        # The bot never joins a voice channel: no "PyNaCl / davey is not installed" warnings at every start.
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
        super().__init__(intents=intents, allowed_mentions=NO_PINGS)
        self.kb = kb
        self.settings = settings
        self.metrics = metrics
        self.rule = AudienceRule(kb, state if state is not None else BotState.answering(kb), self,
                                 ttl_seconds=settings.channel_audience_ttl,
                                 max_members=settings.channel_audience_max_members,
                                 guest_access=settings.guest_access)
        self.audiences = self.rule.channels  # channel member lists, invalidated on member/role/channel events
        self.flow = ChatFlow(kb, PLATFORM, metrics, state=self.rule.channels.state,
                             lease_seconds=settings.answer_lease_seconds,
                             heartbeat_seconds=settings.answer_heartbeat_seconds, rule=self.rule,
                             listed_admin=settings.is_listed_admin)
        self._sweeper: asyncio.Task[None] | None = None
        self.background = self.flow.tasks  # `/kb` jobs still running (a reindex), run by the chat core
        self.tree = app_commands.CommandTree(self)
        self.tree.error(self._on_command_error)  # discord.py's documented way to replace the tree's on_error
        _register_commands(self)

    # ---- start-up -------------------------------------------------------------------------------------------------

    async def setup_hook(self) -> None:
        """Runs at login: feedback buttons of earlier answers work again, and the commands are registered."""
        self.add_dynamic_items(FeedbackButton, ShareButton)
        await self.sync_commands()
        # A Discord message is never redelivered: questions a crashed process claimed but never answered are
        # finished by the sweeper, in the message it had started (bot.chat.lease).
        self._sweeper = start_sweeper(self.flow, self.resume, self.settings.answer_sweep_seconds)

    async def close(self) -> None:
        await stop_sweeper(self._sweeper)
        self._sweeper = None
        await super().close()

    async def sync_commands(self) -> list[app_commands.AppCommand]:
        """To DISCORD_GUILD_ID when set (instant), otherwise globally (Discord may take up to an hour)."""
        if self.settings.discord_guild_id:
            guild = discord.Object(id=self.settings.discord_guild_id)
            self.tree.copy_global_to(guild=guild)
            return await self.tree.sync(guild=guild)
        return await self.tree.sync()

    # ---- who asks, who reads ----------------------------------------------------------------------------------------

    @staticmethod
    def identity(user: discord.abc.User) -> str:
        return f"{PLATFORM}:{user.id}"

    def standing(self, user: discord.abc.User) -> Standing:
        """Discord has no guests; with DISCORD_GUEST_WITHOUT_ROLE a server member holding no role besides @everyone
        is treated as one (bot.chat.guests). In a DM the user is looked up in the servers the gateway cached: a
        role in any of them makes a member; found nowhere with a role, a guest (fail closed)."""
        if not self.settings.discord_guest_without_role:
            return MEMBER
        if isinstance(user, discord.Member):
            return MEMBER if len(user.roles) > 1 else Standing(True, "a server member without a role")
        for guild in self.guilds:
            member = guild.get_member(user.id)
            if member is not None and len(member.roles) > 1:
                return MEMBER
        return Standing(True, "a user without a role in the bot's servers")

    def person_of(self, user: discord.abc.User, *, manage_guild: bool = False) -> PersonInfo:
        """Discord tells no email (the identity map gives a person's documents); the standing from the event's user;
        an admin: Manage Server in the server the interaction came from."""
        return PersonInfo(None, self.standing(user), admin=manage_guild)

    # The core's Directory (bot.chat.readers), for a question resumed from its stored target.

    async def person(self, identity: str) -> PersonInfo:
        """By id alone: the user as the gateway cached them (a role in any of the bot's servers makes a member)."""
        user_id = int(identity.partition(":")[2] or 0)
        return PersonInfo(None, self.standing(self.get_user(user_id) or discord.Object(user_id)))  # type: ignore[arg-type]

    async def channel_members(self, key: str, limit: int) -> list[Member] | None:
        _, guild_id, channel_id = key.split(":")
        return await self.guild_channel_members(int(guild_id), int(channel_id), limit)

    async def reads_channel(self, key: str, user: discord.abc.User) -> bool:
        """Could this user view the channel `key` ("discord:<guild>:<channel>")? For `/kb gaps`."""
        parts = key.split(":")
        if len(parts) != 3 or parts[0] != PLATFORM or not parts[1].isdigit() or not parts[2].isdigit():
            return False
        guild_id, channel_id = int(parts[1]), int(parts[2])
        return await self.audiences.may_read(key, self.identity(user),
                                             lambda limit: self.guild_channel_members(guild_id, channel_id, limit))

    async def guild_channel_members(self, guild_id: int, channel_id: int, limit: int) -> list[Member] | None:
        """None when @everyone may view the channel; otherwise every guild member who may (Discord's own
        permission arithmetic: roles, overwrites, Administrator, the owner). Members come from the gateway cache
        when it holds the whole guild, else from `GET /guilds/{id}/members` paged by `after` (it needs the Server
        Members intent switched on in the Developer Portal; without it Discord answers 403 and the audience falls
        back to everyone + grants)."""
        guild = self.get_guild(guild_id)
        channel = guild.get_channel(channel_id) if guild is not None else None
        if guild is None or channel is None:
            raise AudienceUnavailable(f"channel {channel_id} of server {guild_id} is not in the gateway cache")
        if channel.permissions_for(guild.default_role).view_channel:
            return None
        members: list[discord.Member]
        if guild.chunked and guild.member_count and len(guild.members) >= guild.member_count:
            members = list(guild.members)
        else:
            members = await self._fetch_guild_members(guild)
        viewers = [m for m in members if channel.permissions_for(m).view_channel]
        people = [m for m in viewers if not m.bot]
        if len(people) > limit:
            raise AudienceUnavailable(f"more than CHANNEL_AUDIENCE_MAX_MEMBERS={limit} members")
        return [Member(self.identity(m), None, m.bot, self.standing(m).outsider) for m in viewers]

    async def _fetch_guild_members(self, guild: discord.Guild) -> list[discord.Member]:
        members: list[discord.Member] = []
        after: int | None = None
        while True:
            try:
                page = await self.http.get_members(guild.id, GUILD_MEMBERS_PAGE, after)
            except discord.HTTPException as exc:
                raise AudienceUnavailable(f"GET /guilds/{guild.id}/members failed: {exc.status} {exc.text}") from exc
            members += [discord.Member(data=data, guild=guild, state=self._connection) for data in page]
            if len(members) > MAX_GUILD_MEMBERS_SCANNED:
                raise AudienceUnavailable(f"the server has more than {MAX_GUILD_MEMBERS_SCANNED} members")
            if len(page) < GUILD_MEMBERS_PAGE:
                return members
            after = int(page[-1]["user"]["id"])

    # Membership changes: the affected channels' audiences are recomputed at the next question. Member events need
    # the Server Members intent on the gateway; channel and role updates arrive with the default intents.

    def _forget_guild(self, guild_id: int) -> None:
        self.audiences.invalidate_prefix(f"{PLATFORM}:{guild_id}:")

    async def on_guild_channel_update(self, before: Any, after: Any) -> None:
        self.audiences.invalidate(channel_key(after.guild.id, after.id))

    async def on_guild_channel_delete(self, channel: Any) -> None:
        self.audiences.invalidate(channel_key(channel.guild.id, channel.id))

    async def on_guild_role_update(self, before: discord.Role, after: discord.Role) -> None:
        self._forget_guild(after.guild.id)

    async def on_member_update(self, before: discord.Member, after: discord.Member) -> None:
        if before.roles != after.roles:
            self._forget_guild(after.guild.id)

    async def on_member_join(self, member: discord.Member) -> None:
        self._forget_guild(member.guild.id)

    async def on_member_remove(self, member: discord.Member) -> None:
        self._forget_guild(member.guild.id)

    # ---- answering ------------------------------------------------------------------------------------------------

    async def answer_into(self, send: Send, question: str, user: discord.abc.User, target: AnswerTarget,
                          conversation_id: str,
                          history: Callable[[], Awaitable[Sequence[ChatMessage] | None]] | None = None,
                          private: bool = False, *, auto: bool = False, claim: LeaseClaim | None = None,
                          settings: ChannelSettings | None = None) -> Answer | None:
        """Answer `question` through the shared chat flow and post it through `send`: progressively while Claude
        writes, then the final answer split within Discord's limits, its sources and 👍/👎 buttons. A failure
        anywhere becomes a short message with an error id (the same id is in the log with the traceback). A private
        answer in a server carries "Share in channel". Who reads it is `target.readers`, by the core's rule.
        `settings`: the channel's settings the privacy decision read (`ChatFlow.answers_privately`): read once."""
        reply = (PrivateReply if private else ProgressiveReply)(send, self.settings.discord_edit_interval_seconds)
        ask = self.flow.ask(question, conversation_id, self.identity(user), target, history=history, auto=auto,
                            person=self.person_of(user), settings=settings)
        return await self.flow.answer(ask, reply, claim=claim, target=target.to_json() if claim is not None else None)

    async def resume(self, pending: PendingQuestion) -> tuple[Ask, Reply] | None:
        """A question whose holder died: rebuilt by the chat core from its stored target (`ChatFlow.resume`). One
        read by a channel's members waits for the gateway's servers first (at most READY_WAIT_SECONDS; then the
        audience fails closed to `everyone` + grants, as for any channel whose members cannot be listed)."""
        target = AnswerTarget.from_json(pending.target)
        if target is not None and target.readers.channel is not None and not self.is_ready():
            try:
                await asyncio.wait_for(self.wait_until_ready(), READY_WAIT_SECONDS)
            except TimeoutError:
                logger.info("discord: resuming %s before the gateway was ready", pending.claim.key)
        return await self.flow.resume(pending, self.reply_for)

    async def reply_for(self, post: Mapping[str, Any], placeholder: str | None) -> Reply | None:
        """The `Reply` for a resumed question: the answer replaces the message the dead holder had started, or is
        posted afresh. An `/ask` is finished through its interaction's follow-up webhook (ephemeral when it was
        private); None once its token has expired."""
        interval = self.settings.discord_edit_interval_seconds
        reply: ProgressiveReply
        if hook := post.get("interaction"):
            if time.time() > float(hook["expires"]):
                return None
            webhook = discord.Webhook.from_state({"id": int(hook["application"]), "type": 3, "token": hook["token"]},
                                                 self._connection)
            ephemeral = bool(hook["ephemeral"])

            async def followup(**kwargs: Any) -> Any:
                return await webhook.send(wait=True, ephemeral=ephemeral, **kwargs)

            posted = _FollowupMessage(webhook, int(placeholder)) if placeholder else None
            reply = (PrivateReply if hook.get("share") else ProgressiveReply)(followup, interval, message=posted)
        else:
            channel = self.get_partial_messageable(int(post["channel"]))
            started = channel.get_partial_message(int(placeholder)) if placeholder else None
            reply = ProgressiveReply(channel.send, interval, message=started)
        return reply

    def question_from(self, message: discord.Message) -> str:
        """The message text without the bot's mention (`<@id>` or `<@!id>`)."""
        assert self.user is not None
        return re.sub(rf"<@!?{self.user.id}>", " ", message.content).strip()

    async def claim(self, message: discord.Message) -> LeaseClaim | None:
        """A claim (a lease, `bot.chat.lease`) the first time: a replayed gateway event or a second replica of the
        bot never answers twice. Only messages the bot acts on are recorded (with the Message Content intent it
        sees every message)."""
        return await self.flow.claim_question(f"{PLATFORM}:message:{message.id}")

    async def on_message(self, message: discord.Message) -> None:
        if message.author.bot or self.user is None or message.author.id == self.user.id:
            return  # ourselves and other bots
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return  # joins, pins, "thread created" notices...
        question = self.question_from(message)
        mentioned = any(user.id == self.user.id for user in message.mentions)  # not via @everyone
        if message.guild is None:  # a DM: answered as the asker
            if question and (claim := await self.claim(message)):
                await self.answer_into(message.channel.send, question, message.author,
                                       _target(message.channel.id, None, None), f"{PLATFORM}:dm:{message.channel.id}",
                                       claim=claim)
            return
        guild_id, channel = message.guild.id, message.channel
        # A thread (or a channel discord.py has not cached, which may be one): replies there are follow-ups when
        # the bot has answered in it; a mention there is answered in place.
        if isinstance(channel, (discord.Thread, discord.PartialMessageable)):
            if not question:
                return
            conversation = f"{PLATFORM}:{guild_id}:{channel.id}"
            followup = await self.flow.answered_in(conversation)
            if not (mentioned or followup) or not (claim := await self.claim(message)):
                return
            parent = channel.parent_id if isinstance(channel, discord.Thread) else None
            await self.answer_into(
                channel.send, question, message.author, _target(channel.id, guild_id, parent or channel.id),
                conversation, self.flow.history(conversation, lambda: self.thread_history(channel, before=message),
                                                me=str(self.user.id), before=message.created_at.timestamp(),
                                                question_id=str(message.id)),
                claim=claim,
            )
            return
        if not mentioned:
            await self.auto_answer(message, question, guild_id)
            return
        if not (claim := await self.claim(message)):
            return
        if await self.flow.hint_if_empty(question, claim,
                                         lambda hint: message.reply(hint, allowed_mentions=NO_PINGS)):
            return
        try:
            thread = await message.create_thread(name=thread_name(question), auto_archive_duration=1440)
        except discord.HTTPException:
            error_id = new_error_id()
            logger.exception("discord: could not open a thread (error id %s)", error_id)
            self.flow.count("errors", "thread")
            await self.flow.delivered(claim)  # the apology below is the answer: not resumed
            await message.reply("I couldn't open a thread for the answer here: do I have the Create Public Threads "
                                f"permission in this channel? (error id `{error_id}`)", allowed_mentions=NO_PINGS)
            return
        await self.answer_into(thread.send, question, message.author, _target(thread.id, guild_id, channel.id),
                               f"{PLATFORM}:{guild_id}:{thread.id}", claim=claim)

    async def auto_answer(self, message: discord.Message, question: str, guild_id: int) -> None:
        """A top-level message, not addressed to the bot, in a channel with `/kb channel auto on`: when it reads as a
        question (needs the Message Content intent to see its text) and the documents answer it, the answer goes
        into a thread opened from the message; otherwise nothing is posted, not even a thread (bot.chat.auto)."""
        key = channel_key(guild_id, message.channel.id)
        claim = await self.flow.auto_claim(question, key, lambda: self.claim(message))
        if claim is None:
            return
        thread: Any = None

        async def send(**kwargs: Any) -> Any:  # the thread is opened only once there is an answer to post
            nonlocal thread
            if thread is None:
                thread = await message.create_thread(name=thread_name(question), auto_archive_duration=1440)
            return await thread.send(**kwargs)

        # A thread started from a message has the message's id: the conversation is known before it exists.
        await self.answer_into(send, question, message.author, _target(message.channel.id, guild_id, message.channel.id),
                               f"{PLATFORM}:{guild_id}:{message.id}", auto=True, claim=claim)

    async def thread_history(self, thread: Any, before: discord.Message) -> list[ThreadMessage]:
        """The messages of a thread before the one the bot is mentioned in, oldest first, for the core's history
        policy (`ChatFlow.history`)."""
        assert self.user is not None
        newest_first = [ThreadMessage(str(old.author.id), old.author.bot, old.content if old.author.id == self.user.id
                                      else self.question_from(old), old.created_at.timestamp(), str(old.id))
                        async for old in thread.history(limit=PRIOR_MESSAGES_LIMIT, before=before)]
        return newest_first[::-1]

    # ---- feedback -----------------------------------------------------------------------------------------------

    async def share_answer(self, interaction: discord.Interaction, answer_id: int) -> None:
        """"Share in channel": the question of a private answer answered AGAIN with the channel's audience and
        posted for everyone (the private text is never reposted). Only its asker may share it, once."""
        guild_id = interaction.guild_id
        share = (SHARE_NOT_YOURS if guild_id is None
                 else await self.flow.claim_share(answer_id, self.identity(interaction.user)))
        if isinstance(share, str):
            await interaction.response.send_message(share, ephemeral=True, allowed_mentions=NO_PINGS)
            return
        await interaction.response.defer(thinking=True)  # a public message, within Discord's 3 seconds
        channel = interaction.channel
        channel_id = interaction.channel_id or 0
        if isinstance(channel, discord.Thread) and channel.parent_id:
            channel_id = channel.parent_id

        async def send(**kwargs: Any) -> Any:
            return await interaction.followup.send(wait=True, **kwargs)

        # Answered again as any question in this channel: its audience and its sources (`/kb channel sources`).
        await self.answer_into(send, share.question, interaction.user,
                               _target(interaction.channel_id or 0, guild_id, channel_id),
                               f"{PLATFORM}:{guild_id}:{interaction.channel_id}:share:{answer_id}")

    async def record_feedback(self, interaction: discord.Interaction, answer_id: int, vote: Rating) -> None:
        ack = await self.flow.feedback(answer_id, self.identity(interaction.user), vote)
        await interaction.response.send_message(ack.text, ephemeral=True, allowed_mentions=NO_PINGS)

    # ---- errors -------------------------------------------------------------------------------------------------

    async def _on_command_error(self, interaction: discord.Interaction,
                                error: app_commands.AppCommandError) -> None:
        text = self.flow.failure("command", error, doing="running that command")
        if interaction.response.is_done():
            await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_PINGS)
        else:
            await interaction.response.send_message(text, ephemeral=True, allowed_mentions=NO_PINGS)


class _FollowupMessage:
    """A follow-up message an earlier process posted for an interaction, edited through the interaction's webhook
    (PATCH /webhooks/{application}/{token}/messages/{id}) as `ProgressiveReply` edits its message."""

    def __init__(self, webhook: discord.Webhook, message_id: int) -> None:
        self.webhook = webhook
        self.id = message_id

    async def edit(self, **kwargs: Any) -> Any:
        return await self.webhook.edit_message(self.id, **kwargs)


def _interaction_target(interaction: discord.Interaction, audience_channel_id: int | None, *, ephemeral: bool,
                        share: bool) -> AnswerTarget:
    """`_target` for an `/ask` (its channel's settings apply, also to a private answer), plus what finishing it
    through the interaction needs: the application id and the interaction token (a credential for this
    interaction's follow-ups only, valid 15 minutes; dropped from the claim once the answer is delivered), and
    whether the answer is ephemeral and carries "Share in channel"."""
    target = _target(interaction.channel_id or 0, interaction.guild_id, audience_channel_id,
                     settings=_interaction_channel_key(interaction))
    post = {**target.post, "interaction": {
        "application": str(interaction.application_id), "token": interaction.token, "ephemeral": ephemeral,
        "share": share, "expires": time.time() + INTERACTION_TOKEN_SECONDS - INTERACTION_RESUME_MARGIN,
    }}
    return AnswerTarget(target.readers, post, target.settings)


def _target(channel_id: int, guild_id: int | None, audience_channel_id: int | None, *,
            settings: str | None = None) -> AnswerTarget:
    """Where a question is answered: the channel (or thread, or DM) to post in (ids as strings: JSON), and who
    reads it: the members of `audience_channel_id` (a thread's parent), or the asker alone (None: a DM, a private
    answer). That channel's settings apply, unless `settings` names another (a private answer in a channel)."""
    readers = Readers(channel_key(guild_id, audience_channel_id)
                      if guild_id is not None and audience_channel_id is not None else None)
    return AnswerTarget(readers, {"channel": str(channel_id), "guild": str(guild_id) if guild_id is not None else None},
                        settings=settings or readers.channel)


def channel_key(guild_id: int, channel_id: int) -> str:
    return f"{PLATFORM}:{guild_id}:{channel_id}"


def thread_name(question: str) -> str:
    name = " ".join(quote_safe(question).split())
    return name if len(name) <= THREAD_NAME_LIMIT else name[: THREAD_NAME_LIMIT - 1].rstrip() + "…"


# ---- slash commands -----------------------------------------------------------------------------------------------


def _interaction_channel_key(interaction: discord.Interaction) -> str | None:
    """Grants belong to a channel; a thread uses its parent channel's."""
    if interaction.guild_id is None or interaction.channel_id is None:
        return None
    channel = interaction.channel
    if isinstance(channel, discord.Thread) and channel.parent_id:
        return channel_key(interaction.guild_id, channel.parent_id)
    return channel_key(interaction.guild_id, interaction.channel_id)


def _register_commands(bot: RagbotDiscord) -> None:
    tree = bot.tree

    @tree.command(name="ask", description="Ask a question; the answer cites the documents it comes from.")
    @app_commands.describe(question="What you want to know",
                           private="Only you see the answer, and it may also use documents shared with you "
                                   "(default: the channel's mode)")
    async def ask(interaction: discord.Interaction, question: str, private: bool | None = None) -> None:
        settings = None  # the channel's settings, when its mode was read: the answer uses them (`ChatFlow.ask`)
        if private is None:  # the channel's mode decides (never private in a DM)
            privacy = await bot.flow.answers_privately(question, _interaction_channel_key(interaction), by_word=False)
            private, settings = privacy.private, privacy.settings
        # Claimed like a message (a lease): if this process dies mid-answer, a sweeper finishes it (`resume`).
        claim = await bot.flow.claim_question(f"{PLATFORM}:interaction:{interaction.id}")
        if claim is None:
            return  # delivered to two replicas: the one that claimed it answers
        await interaction.response.defer(thinking=True, ephemeral=private)  # first, within Discord's 3 seconds
        conversation = f"{PLATFORM}:{interaction.guild_id or 'dm'}:{interaction.channel_id}:ask:{interaction.id}"
        async def send(**kwargs: Any) -> Any:
            return await interaction.followup.send(wait=True, ephemeral=private, **kwargs)

        share = bool(private and interaction.guild_id is not None)
        audience_channel = None if private or interaction.guild_id is None else interaction.channel_id
        target = _interaction_target(interaction, audience_channel, ephemeral=bool(private), share=share)
        await bot.answer_into(send, question, interaction.user, target, conversation, private=share, claim=claim,
                              settings=settings)

    kb = app_commands.Group(name="kb", description="Knowledge base administration (admins)",
                            default_permissions=discord.Permissions(manage_guild=True))
    channel_access = app_commands.Group(name="channel-access", parent=kb,
                                        description="What this channel's answers may draw on besides `everyone`")
    users = app_commands.Group(name="users", parent=kb, description="Whom a Discord user asks as in DMs")

    async def run(interaction: discord.Interaction, words: list[str], *, defer: bool = False) -> None:
        """A /kb command, run by the chat core (`ChatFlow.kb_command`: who is an admin, refusals, the command, a
        job's report), every reply ephemeral: the interaction's response first, then follow-ups. Long work is
        acknowledged at once (`defer`, once the command may run) and its result posted when it is done."""
        async def respond(text: str) -> None:
            for piece in split_text(text, MESSAGE_LIMIT) or ["Done."]:
                if not interaction.response.is_done():
                    await interaction.response.send_message(piece, ephemeral=True, allowed_mentions=NO_PINGS)
                else:
                    await interaction.followup.send(piece, ephemeral=True, allowed_mentions=NO_PINGS)

        async def working() -> None:
            if defer:
                await interaction.response.defer(ephemeral=True, thinking=True)

        guild = interaction.guild_id
        who = CommandUser(str(interaction.user.id), _interaction_channel_key(interaction),
                          workspace=f"{PLATFORM}:{guild}:" if guild else None,
                          person=bot.person_of(interaction.user, manage_guild=guild is not None
                                               and interaction.permissions.manage_guild),
                          reads_channel=lambda key: bot.reads_channel(key, interaction.user))
        await bot.flow.kb_command(shlex.join(words), who, respond, working)

    @kb.command(name="help", description="What ragbot and the /kb commands do")
    async def kb_help(interaction: discord.Interaction) -> None:
        await run(interaction, ["help"])

    @kb.command(name="sources", description="The indexed sources and when they last synced")
    async def kb_sources(interaction: discord.Interaction) -> None:
        await run(interaction, ["sources"], defer=True)

    @kb.command(name="status", description="Documents, chunks and the last sync per source")
    async def kb_status(interaction: discord.Interaction) -> None:
        await run(interaction, ["status"], defer=True)

    @kb.command(name="reindex", description="Sync a source now (every source when none is given)")
    @app_commands.describe(source="The source to sync")
    async def kb_reindex(interaction: discord.Interaction, source: str | None = None) -> None:
        await run(interaction, ["reindex", *([source] if source else [])])

    @kb_reindex.autocomplete("source")
    async def kb_reindex_source(interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        names = await bot.kb.source_names()
        return [app_commands.Choice(name=n, value=n) for n in names if current.lower() in n.lower()][:25]

    @channel_access.command(name="add", description="Let answers in this channel use a principal's documents")
    @app_commands.describe(principal="e.g. group:engineering or user:alice@example.com")
    async def channel_access_add(interaction: discord.Interaction, principal: str) -> None:
        await run(interaction, ["channel-access", "add", principal])

    @channel_access.command(name="remove", description="Stop answers in this channel using a principal's documents")
    @app_commands.describe(principal="A principal granted earlier")
    async def channel_access_remove(interaction: discord.Interaction, principal: str) -> None:
        await run(interaction, ["channel-access", "remove", principal])

    @channel_access.command(name="list", description="The principals granted to this channel")
    async def channel_access_list(interaction: discord.Interaction) -> None:
        await run(interaction, ["channel-access", "list"])

    @users.command(name="map", description="Answer this user's DMs with a principal's documents as well")
    @app_commands.describe(user="The Discord user", principal="e.g. user:alice@example.com")
    async def users_map(interaction: discord.Interaction, user: discord.User, principal: str) -> None:
        await run(interaction, ["users", "map", bot.identity(user), principal])

    @users.command(name="list", description="Which Discord users are mapped to which principals")
    async def users_list(interaction: discord.Interaction) -> None:
        await run(interaction, ["users", "list"])

    channel_group = app_commands.Group(name="channel", parent=kb,
                                       description="This channel's sources, auto-answers and answer mode (admins)")

    @channel_group.command(name="show", description="This channel's settings")
    async def channel_show(interaction: discord.Interaction) -> None:
        await run(interaction, ["channel", "show"])

    @channel_group.command(name="sources", description="Only these sources answer in this channel")
    @app_commands.describe(action="add or remove", source="A source name (see /kb sources)")
    async def channel_sources(interaction: discord.Interaction, action: Literal["add", "remove"], source: str) -> None:
        await run(interaction, ["channel", "sources", action, source])

    @channel_group.command(name="auto", description="Answer questions here without a mention, when there is an answer")
    async def channel_auto(interaction: discord.Interaction, state: Literal["on", "off"]) -> None:
        await run(interaction, ["channel", "auto", state])

    @channel_group.command(name="mode", description="Answer in public or privately (to the asker)")
    async def channel_mode_command(interaction: discord.Interaction, mode: Literal["public", "private"]) -> None:
        await run(interaction, ["channel", "mode", mode])

    @kb.command(name="gaps", description="Questions the bot declined, was unsure about or got 👎 on, by topic")
    async def kb_gaps(interaction: discord.Interaction) -> None:
        await run(interaction, ["gaps"], defer=True)
    @kb.command(name="access", description="A person's principals and where each came from (and one document)")
    @app_commands.describe(user="A Discord user", principal="Or a principal, e.g. user:alice@example.com",
                           document="A document id, URL, SOURCE:ID or title: may they see it, and why")
    async def kb_access(interaction: discord.Interaction, user: discord.User | None = None,
                        principal: str | None = None, document: str | None = None) -> None:
        who = bot.identity(user) if user is not None else (principal or "")
        await run(interaction, ["access", *([who] if who else []), *([document] if document else [])], defer=True)

    tree.add_command(kb)


# ---- running ------------------------------------------------------------------------------------------------------


CONNECT_TIMEOUT_SECONDS = 60


class DiscordStartError(StartupError):
    """Discord would not let the bot in (its message names the setting to fix). A ValueError, so `ragbot run`
    shows it as a one-line error."""


class DiscordAdapter:
    """What `bot/app.py` starts when DISCORD_TOKEN is set: log in (which syncs the commands), then hold the
    gateway connection in a background task until stopped."""

    name = PLATFORM

    def __init__(self, context: BotContext) -> None:
        self.context = context
        self.client: RagbotDiscord | None = None
        self._connection: asyncio.Task[None] | None = None

    def routes(self) -> list[Any]:
        return []  # Discord talks to us over the gateway; nothing to serve on PORT

    async def start(self) -> None:
        """Log in (syncing the commands) and connect; returns once Discord has accepted the connection. A refused
        token or intent raises `DiscordStartError`, whose message says what to change."""
        settings = self.context.settings
        assert settings.discord_bot_token is not None
        configure_api_url(settings.discord_api_url)
        configure_gateway_url(settings.discord_gateway_url)
        self.client = RagbotDiscord(self.context.kb, settings, self.context.metrics, self.context.state)
        try:
            await self.client.login(settings.discord_bot_token.get_secret_value())
        except discord.LoginFailure as exc:
            await self.client.close()
            raise DiscordStartError(
                "Discord refused DISCORD_TOKEN: copy the bot token again from the Developer Portal (Bot → Reset "
                "Token) into DISCORD_TOKEN"
            ) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            await self.client.close()
            where = settings.discord_api_url or "https://discord.com/api"
            raise DiscordStartError(
                f"could not reach Discord at {where} ({type(exc).__name__}): check the network (a proxy, a firewall)"
                f"{', or DISCORD_API_URL' if settings.discord_api_url else ''}"
            ) from exc
        self._connection = asyncio.create_task(self.client.connect(reconnect=True), name="ragbot-discord-gateway")
        connected = asyncio.create_task(self.client.wait_for("connect"), name="ragbot-discord-connected")
        done, _ = await asyncio.wait({self._connection, connected}, timeout=CONNECT_TIMEOUT_SECONDS,
                                     return_when=asyncio.FIRST_COMPLETED)
        connected.cancel()
        if self._connection in done:
            error = self._connection.exception()
            await self.client.close()
            if isinstance(error, discord.PrivilegedIntentsRequired):
                raise DiscordStartError(
                    "Discord refused the Message Content intent: switch it on in the Developer Portal (Bot → "
                    "Privileged Gateway Intents → Message Content Intent), or set DISCORD_MESSAGE_CONTENT=false"
                ) from error
            raise DiscordStartError(f"could not connect to Discord's gateway: {error}") from error
        if not done:
            logger.warning("discord: still connecting after %s s; carrying on in the background",
                           CONNECT_TIMEOUT_SECONDS)
        self._connection.add_done_callback(_log_gateway_end)

    async def stop(self) -> None:
        if self.client is not None and not self.client.is_closed():
            await self.client.close()
        if self._connection is not None:
            self._connection.cancel()
            try:
                await self._connection
            except (asyncio.CancelledError, Exception):
                pass


def _log_gateway_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("discord: the gateway connection ended", exc_info=task.exception())
