#!/bin/bash
echo lemon > /workspace/log.txt
