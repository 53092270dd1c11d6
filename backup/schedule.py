"""Cron schedules (the five fields of crontab(5), in UTC): parsed once, with errors that say
which field is wrong, and the next time they fire. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
NAMES = {
    "month": {
        m: i + 1
        for i, m in enumerate(
            ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        )
    },
    "day of week": {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
}


class ScheduleError(ValueError):
    pass


def _value(text: str, field: str, low: int, high: int) -> int:
    number = NAMES.get(field, {}).get(text.lower()) if not text.isdigit() else int(text)
    if number is None or not low <= number <= high:
        raise ScheduleError(f"{field}: {text!r} is not in {low}-{high}")
    return number


def _field(text: str, field: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ScheduleError(f"{field}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _value(first, field, low, high), _value(last, field, low, high)
            if start > end:
                raise ScheduleError(f"{field}: range {base!r} runs backwards")
        else:
            start = _value(base, field, low, high)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is *
    any_weekday: bool  # day of week is *

    @classmethod
    def parse(cls, text: str) -> Schedule:
        expression = ALIASES.get(text.strip().lower(), text.strip())
        parts = expression.split()
        if len(parts) != 5:
            raise ScheduleError(f"{text!r} needs five fields (minute hour day-of-month month day-of-week)")
        fields = [_field(p, *spec) for p, spec in zip(parts, FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in fields[4])  # 7 is Sunday too
        return cls(fields[0], fields[1], fields[2], fields[3], weekdays, parts[2] == "*", parts[4] == "*")

    def _day_matches(self, moment: datetime) -> bool:
        weekday = (moment.weekday() + 1) % 7
        if self.any_day or self.any_weekday:  # crontab(5): with both restricted, either matches
            return moment.day in self.days and weekday in self.weekdays
        return moment.day in self.days or weekday in self.weekdays

    def next_after(self, moment: datetime) -> datetime:
        """The first time strictly after `moment` (UTC) at which the schedule fires."""
        candidate = moment.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = candidate + timedelta(days=366 * 5)
        while candidate < limit:
            if candidate.month not in self.months:
                candidate = (candidate.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(candidate):
                candidate = candidate.replace(hour=0, minute=0) + timedelta(days=1)
            elif candidate.hour not in self.hours:
                candidate = candidate.replace(minute=0) + timedelta(hours=1)
            elif candidate.minute not in self.minutes:
                candidate += timedelta(minutes=1)
            else:
                return candidate
        raise ScheduleError("the schedule never fires (e.g. 30 February)")
