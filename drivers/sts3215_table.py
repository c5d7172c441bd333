"""The Feetech STS3215 control table, as the servo (and LeRobot 0.6.1) lays it out.

One source of truth for the emulator and the driver: register name -> (address, size in bytes).
Multi-byte registers are little-endian (protocol_end 0 on the STS series).
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.conventions import MAX_TICK

MODEL_NUMBER_STS3215 = 777
FIRMWARE_MAJOR = 3
FIRMWARE_MINOR = 10
TICKS_PER_TURN = MAX_TICK + 1  # 4096 (MAX_TICK is LeRobot's "max_res", defined with the unit conventions)

# Baud_Rate register codes. Code 0 (1 Mbaud) is the only one LeRobot writes; the others are the
# STS datasheet's table.
BAUD_RATE_BY_CODE = {0: 1_000_000, 1: 500_000, 2: 250_000, 3: 128_000, 4: 115_200, 5: 76_800, 6: 57_600, 7: 38_400}

# name: (address, size)
CONTROL_TABLE: dict[str, tuple[int, int]] = {
    # EEPROM (persisted; writable only while Lock == 0)
    "Firmware_Major_Version": (0, 1),
    "Firmware_Minor_Version": (1, 1),
    "Model_Number": (3, 2),
    "ID": (5, 1),
    "Baud_Rate": (6, 1),
    "Return_Delay_Time": (7, 1),
    "Response_Status_Level": (8, 1),
    "Min_Position_Limit": (9, 2),
    "Max_Position_Limit": (11, 2),
    "Max_Temperature_Limit": (13, 1),
    "Max_Voltage_Limit": (14, 1),
    "Min_Voltage_Limit": (15, 1),
    "Max_Torque_Limit": (16, 2),
    "Phase": (18, 1),
    "Unloading_Condition": (19, 1),
    "LED_Alarm_Condition": (20, 1),
    "P_Coefficient": (21, 1),
    "D_Coefficient": (22, 1),
    "I_Coefficient": (23, 1),
    "Minimum_Startup_Force": (24, 2),
    "CW_Dead_Zone": (26, 1),
    "CCW_Dead_Zone": (27, 1),
    "Protection_Current": (28, 2),
    "Angular_Resolution": (30, 1),
    "Homing_Offset": (31, 2),
    "Operating_Mode": (33, 1),
    "Protective_Torque": (34, 1),
    "Protection_Time": (35, 1),
    "Overload_Torque": (36, 1),
    "Velocity_closed_loop_P_proportional_coefficient": (37, 1),
    "Over_Current_Protection_Time": (38, 1),
    "Velocity_closed_loop_I_integral_coefficient": (39, 1),
    # SRAM (volatile)
    "Torque_Enable": (40, 1),
    "Acceleration": (41, 1),
    "Goal_Position": (42, 2),
    "Goal_Time": (44, 2),
    "Goal_Velocity": (46, 2),
    "Torque_Limit": (48, 2),
    "Lock": (55, 1),
    "Present_Position": (56, 2),
    "Present_Velocity": (58, 2),
    "Present_Load": (60, 2),
    "Present_Voltage": (62, 1),
    "Present_Temperature": (63, 1),
    "Status": (65, 1),
    "Moving": (66, 1),
    "Present_Current": (69, 2),
    # Factory
    "Maximum_Acceleration": (85, 1),
}

EEPROM_END = 40  # addresses below this are EEPROM
TABLE_SIZE = 256

# Sign-magnitude encodings: register -> index of the sign bit.
SIGN_BIT: dict[str, int] = {
    "Homing_Offset": 11,
    "Goal_Velocity": 15,
    "Present_Velocity": 15,
    "Present_Position": 15,
    "Goal_Position": 15,
    "Present_Load": 10,
    # Feetech's own SMS/STS library decodes the current with sign bit 15 (the issue-19 audit);
    # LeRobot 0.6.1 reads it unsigned. A negative current must not read as 5 A.
    "Present_Current": 15,
}

# Status-packet error bits (and the Status register's bits).
ERR_VOLTAGE = 0x01
ERR_ANGLE_SENSOR = 0x02
ERR_OVERHEAT = 0x04
ERR_OVERCURRENT = 0x08
ERR_OVERLOAD = 0x20
ERROR_BIT_NAMES = {
    ERR_VOLTAGE: "voltage",
    ERR_ANGLE_SENSOR: "angle_sensor",
    ERR_OVERHEAT: "overheat",
    ERR_OVERCURRENT: "overcurrent",
    ERR_OVERLOAD: "overload",
}


def describe_error_bits(bits: int) -> list[str]:
    """Human names of the error bits set in a status byte."""
    return [name for bit, name in ERROR_BIT_NAMES.items() if bits & bit]


def encode_sign_magnitude(value: int, sign_bit: int) -> int:
    """Signed integer -> sign-magnitude register value (raises if the magnitude does not fit)."""
    magnitude = abs(int(value))
    if magnitude >= (1 << sign_bit):
        raise ValueError(f"magnitude {magnitude} exceeds {(1 << sign_bit) - 1} (sign bit {sign_bit})")
    return magnitude | ((1 << sign_bit) if value < 0 else 0)


def decode_sign_magnitude(raw: int, sign_bit: int) -> int:
    """Sign-magnitude register value -> signed integer."""
    magnitude = raw & ((1 << sign_bit) - 1)
    return -magnitude if raw & (1 << sign_bit) else magnitude


@dataclass(frozen=True)
class Register:
    name: str
    address: int
    size: int

    @property
    def is_eeprom(self) -> bool:
        return self.address < EEPROM_END


def register(name: str) -> Register:
    addr, size = CONTROL_TABLE[name]
    return Register(name, addr, size)
