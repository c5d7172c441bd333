"""Hardware at the edges: the Feetech STS3215 bus, our SO-101 arm driver and the bus emulator.

- ``sts3215_table``   the servo's control table (addresses, sizes, EEPROM/SRAM, sign encodings)
- ``protocol``        Feetech protocol 0 packets (instruction and status), checksums
- ``arm_interface``   the small interface the daemon's control loop sees (leader / follower)
- ``feetech_arm``     our SO-101 arm driver over a real (or emulated) serial bus
- ``emulator/``       the STS3215 bus emulator on a pseudo-terminal ("try it without an arm")
"""
